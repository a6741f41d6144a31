/* Argument checks one binding file lends the others (py_decoder.c runs what py_kv_cache.c,
 * py_attention.c and py_comm.c bind, and checks its arguments the same way). */
#pragma once
#include "attention.h"
#include "comm.h"
#include "moe.h"
#include "pyarg.h"

/* The cache arrays k_cache, v_cache, k_scale, v_scale, k_zero, v_zero (obj[2..5] may be NULL or
 * None) as a dn_kv_cache_t of the format their item type names. 0, or -1 with an exception. */
int dn_take_kv_cache(dn_args *a, PyObject *const obj[6], int writable, int head_dim,
                     dn_kv_cache_t *c);

/* slots [T] inside the cache (negative: skipped). 0, or -1 with an exception. */
int dn_check_slots(dn_args *a, const dn_kv_cache_t *c, const int32_t *slots, int T);

/* A step's q_offsets [B+1] (0..T, increasing), context_lens [B] and block_tables [B, max_blocks]
 * fit each other and the cache. 0, or -1 with an exception. */
int dn_check_step(dn_args *a, const dn_kv_cache_t *c, int T, const int32_t *q_offsets,
                  const int32_t *context_lens, const int32_t *block_tables, int B, int max_blocks);

/* n_heads query heads from head q_head0 of a GQA group of *group read exactly n_kv_heads kv
 * heads (*group 0: whole groups, set to n_heads / n_kv_heads). 0, or -1 with an exception. */
int dn_check_groups(dn_args *a, int n_heads, int n_kv_heads, int *group, int q_head0);

/* The dn_comm of a comm_open capsule, or NULL with an exception. */
dn_comm *dn_comm_of(PyObject *capsule, const char *fn);

/* A sparse layer's fields (DN_MOE_FIELDS, NULL-terminated) from `fields`, a dict: the router,
 * the experts' packed rows and the shared expert. s has the routing and hidden set; its inter
 * (0: not yet) is taken from the first layer and checked against the others'. w's expert arrays
 * are PyMem: dn_moe_weights_release frees them. 0, or -1 with an exception. */
extern const char *const DN_MOE_FIELDS[];
int dn_take_moe(dn_args *a, PyObject *fields, dn_moe_shape *s, dn_moe_weights *w);
void dn_moe_weights_release(dn_moe_weights *w);
/* s from the routing arguments, checked (n_local follows); 0, or -1 with a ValueError. */
int dn_moe_shape_init(dn_moe_shape *s, int n_experts, int top_k, int norm_topk, int sigmoid, double routed_scale,
                      int expert0, int expert_step, int hidden, int shared_inter, dn_act act);
/* *sigmoid from a scoring name ("softmax", the default when NULL, or "sigmoid"); 0, or -1 with a ValueError. */
int dn_moe_parse_scoring(const char *fn, const char *name, int *sigmoid);

/* The packed linear at buf (len bytes) into w, checked to be [n, k]; 0, or -1 with a ValueError
 * naming it. */
int dn_open_linear(dn_args *a, const char *name, const uint8_t *buf, size_t len, dn_linear_w *w, int64_t n,
                   int64_t k);
