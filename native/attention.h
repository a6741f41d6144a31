/* Paged attention with GQA over a block KV cache (kv_cache.h says how the cache is stored).
 * Callers validate every argument (py_attention.c does); these functions trust them. */
#pragma once
#include <stdint.h>

#include "kv_cache.h"

/* One continuous-batching step: B sequences, sequence b owns query rows q_offsets[b]..q_offsets[b+1]
 * which sit at its last q_len positions of context_lens[b] cached tokens and attend causally.
 * window > 0: the query at position p sees only the keys at p - window < j <= p (transformers'
 * sliding_window); 0: the whole context. softcap > 0: a score s becomes softcap * tanh(s / softcap)
 * before the softmax (Gemma 2's attn_logit_softcapping); 0: none. sinks: NULL, or one logit per
 * query head of this call (gpt-oss's attention sinks): exp(sinks[h] - max) joins the softmax's
 * denominator as if a key of score sinks[h] and value 0 were seen by every query of head h.
 * Query head h reads kv head (h + q_head0) / group: a tensor-parallel rank may hold part of a GQA
 * group at either end (its heads start at head q_head0 of its first kv head's group, 0 <= q_head0
 * < group, and its kv heads are those its query heads read). Returns 0, or -1 when out of memory. */
int dn_attention(const dn_kv_cache_t *c,
                 const float *q,              /* [T_total, n_heads, head_dim] */
                 const int32_t *block_tables, /* [B, max_blocks] */
                 int max_blocks,
                 const int32_t *q_offsets,    /* [B + 1] */
                 const int32_t *context_lens, /* [B] */
                 int B, int n_heads, int group, int q_head0, float scale,
                 int window, float softcap,
                 const float *sinks,          /* [n_heads] or NULL */
                 float *out);                 /* [T_total, n_heads, head_dim] */
