/* Bindings: kv_write into the paged KV cache (see kv_cache.h), and the checks of a cache's
 * arrays that attention and the decoder share (py_shared.h). Every shape, type and index is
 * checked here, so the kernels can trust their arguments. */
#include "py_shared.h"

/* Item code of a buffer ('H', 'b', 'B', ...), or 0 when obj has none (dn_take then says why). */
static char peek_code(PyObject *obj) {
    Py_buffer v;
    if (obj == Py_None || PyObject_GetBuffer(obj, &v, PyBUF_FORMAT | PyBUF_STRIDES) != 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = v.format ? v.format : "B";
    if (f[0] == '@' || f[0] == '=' || f[0] == '<') f++;
    char code = f[0] && !f[1] ? f[0] : '?';
    PyBuffer_Release(&v);
    return code;
}

/* The format follows the cache's item type; head_dim comes from the float inputs. */
int dn_take_kv_cache(dn_args *a, PyObject *const obj[6], int writable, int head_dim,
                     dn_kv_cache_t *c) {
    static const char *const names[6] = {"k_cache", "v_cache", "k_scale", "v_scale", "k_zero", "v_zero"};
    char code = peek_code(obj[0]);
    if (code == 'f') c->format = DN_KV_F32;
    else if (code == 'H') c->format = DN_KV_BF16;
    else if (code == 'b') c->format = DN_KV_INT8;
    else if (code == 'B') c->format = DN_KV_UINT4;
    else if (code) {
        dn_fail(a, PyExc_TypeError,
                "k_cache must be float32, uint16 (bf16 bits), int8 or uint8 (packed uint4), "
                "got format '%c'",
                code);
        return -1;
    } else
        code = 'H'; /* no buffer: dn_take names the problem */
    Py_buffer *kc = dn_take(a, obj[0], names[0], code, 4, writable);
    if (!kc) return -1;
    Py_buffer *vc = dn_take(a, obj[1], names[1], code, 4, writable);
    if (!vc) return -1;
    for (int d = 0; d < 4; d++)
        if (dn_check_dim(a, vc, names[1], d, kc->shape[d])) return -1;
    c->num_blocks = (int)kc->shape[0];
    c->n_kv_heads = (int)kc->shape[1];
    c->block_size = (int)kc->shape[2];
    c->head_dim = head_dim;
    if (head_dim % 16 || head_dim < 16 || head_dim > 512) {
        dn_fail(a, PyExc_ValueError, "head_dim %d is not a multiple of 16 in 16..512", head_dim);
        return -1;
    }
    if (c->block_size % 16 || c->block_size < 16 || c->block_size > 256) {
        dn_fail(a, PyExc_ValueError, "block_size %d is not a multiple of 16 in 16..256",
                c->block_size);
        return -1;
    }
    if (kc->shape[0] > INT32_MAX / kc->shape[2]) {
        dn_fail(a, PyExc_ValueError, "num_blocks * block_size exceeds int32 slots");
        return -1;
    }
    int last = c->format == DN_KV_UINT4 ? head_dim / 2 : head_dim;
    if (dn_check_dim(a, kc, names[0], 3, last)) return -1;
    c->k = kc->buf;
    c->v = vc->buf;
    float **dst[4] = {&c->k_scale, &c->v_scale, &c->k_zero, &c->v_zero};
    static const char *const fmt_names[4] = {"bf16", "int8", "uint4", "fp32"};
    for (int i = 0; i < 4; i++) {
        int quantized = c->format == DN_KV_INT8 || c->format == DN_KV_UINT4;
        int needed = i < 2 ? quantized : c->format == DN_KV_UINT4;
        PyObject *o = obj[2 + i];
        *dst[i] = NULL;
        if (o == NULL || o == Py_None) {
            if (needed) {
                dn_fail(a, PyExc_TypeError, "%s is required for a %s cache", names[2 + i],
                        fmt_names[c->format]);
                return -1;
            }
            continue;
        }
        if (!needed) {
            dn_fail(a, PyExc_TypeError, "%s must be None for a %s cache", names[2 + i],
                    fmt_names[c->format]);
            return -1;
        }
        Py_buffer *s = dn_take(a, o, names[2 + i], 'f', 3, writable);
        if (!s) return -1;
        for (int d = 0; d < 3; d++)
            if (dn_check_dim(a, s, names[2 + i], d, kc->shape[d])) return -1;
        *dst[i] = s->buf;
    }
    return 0;
}

int dn_check_slots(dn_args *a, const dn_kv_cache_t *c, const int32_t *slots, int T) {
    int64_t n_slots = (int64_t)c->num_blocks * c->block_size;
    for (int t = 0; t < T; t++)
        if (slots[t] >= n_slots) {
            dn_fail(a, PyExc_IndexError, "slots[%d] = %d is out of range for %d blocks of %d tokens",
                    t, slots[t], c->num_blocks, c->block_size);
            return -1;
        }
    return 0;
}

static PyObject *py_kv_write(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"k", "v", "slots", "k_cache", "v_cache", "k_scale", "v_scale",
                             "k_zero", "v_zero", NULL};
    PyObject *k, *v, *slots, *cache[6] = {NULL, NULL, Py_None, Py_None, Py_None, Py_None};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|OOOO:kv_write", kwlist, &k, &v, &slots,
                                     &cache[0], &cache[1], &cache[2], &cache[3], &cache[4],
                                     &cache[5]))
        return NULL;
    dn_args a = {.fn = "kv_write"};
    Py_buffer *kb = dn_take(&a, k, "k", 'f', 3, 0);
    if (!kb) return dn_done(&a, NULL);
    Py_buffer *vb = dn_take(&a, v, "v", 'f', 3, 0);
    if (!vb) return dn_done(&a, NULL);
    for (int d = 0; d < 3; d++)
        if (dn_check_dim(&a, vb, "v", d, kb->shape[d])) return dn_done(&a, NULL);
    Py_buffer *sb = dn_take(&a, slots, "slots", 'i', 1, 0);
    if (!sb) return dn_done(&a, NULL);
    if (dn_check_dim(&a, sb, "slots", 0, kb->shape[0])) return dn_done(&a, NULL);
    dn_kv_cache_t c;
    if (dn_take_kv_cache(&a, cache, 1, (int)kb->shape[2], &c)) return dn_done(&a, NULL);
    if (kb->shape[1] != c.n_kv_heads)
        return dn_fail(&a, PyExc_ValueError, "k has %zd kv heads, the cache %d", kb->shape[1],
                       c.n_kv_heads);
    int T = (int)kb->shape[0];
    const int32_t *sl = sb->buf;
    if (dn_check_slots(&a, &c, sl, T)) return dn_done(&a, NULL);
    Py_BEGIN_ALLOW_THREADS;
    dn_kv_write(&c, kb->buf, vb->buf, sl, T);
    Py_END_ALLOW_THREADS;
    return dn_done(&a, NULL);
}

PyMethodDef dn_kv_cache_methods[] = {
    {"kv_write", (PyCFunction)(void (*)(void))py_kv_write, METH_VARARGS | METH_KEYWORDS,
     "kv_write(k, v, slots, k_cache, v_cache, k_scale=None, v_scale=None, k_zero=None, "
     "v_zero=None): quantize k, v [T, n_kv_heads, head_dim] float32 into the cache slots "
     "(int32 [T], negative = skip). The cache dtype picks the format: float32, uint16 bf16, int8 (+ scales), "
     "uint8 packed uint4 (+ scales and zeros)."},
    {NULL, NULL, 0, NULL},
};
