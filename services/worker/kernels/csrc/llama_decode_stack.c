/* A Llama decoder stack's decode step on CPU in one call: every layer of a step of decode rows.
 *
 * A decode step of a row or two runs a dozen kernels a layer, each one short: from Python every
 * call costs more in the interpreter and the bindings than a small kernel computes. This runs the
 * same kernels in the same order, layer after layer, from C: ztgi's own, through the function
 * pointers the caller hands over (`Kernels`, the libraries `native_library` built), so the
 * arithmetic and its rounding are exactly those of the step taken call by call from Python
 * (`PagedLlamaForward`): for each layer the residual add and RMSNorm, the q/k/v product, rotary of
 * queries and keys, the keys and values written to their pool slots, attention over the blocks in
 * place, the output product, the residual add and RMSNorm, the gate/up product, the SiLU gate and
 * the down product. GGUF block products (`BlockLinear`, any bits and sub-block); activations of
 * bfloat16 (`layer_ops.c`, `paged_decode_attention.c`) or float32 (their `_avx2.c` kernels), as
 * `Dims.row_format` says (`block_weights.h`): this file moves them only as bytes.
 *
 * x [rows, hidden]: the embeddings in, the residual stream before the last layer's MLP
 * out; residual [rows, hidden]: the last layer's MLP output (the caller adds both and normalizes,
 * as `add_rms_norm` does). scratch: at least `llama_decode_scratch_bytes` bytes. Returns 0, or the
 * first kernel's non-zero status (with the layer, from 1, times 100 added).
 */
#include <stdint.h>
#include <string.h>

#include "block_weights.h"

typedef int (*NormFn)(const void *, const void *, const void *, int64_t, int, float, void *, void *, int);
typedef int (*RotaryFn)(const void *, int64_t, int, int, int64_t, const void *, const void *, void *, int);
typedef int (*AttentionFn)(const void *, const void *, const void *, int64_t, const int64_t *, const int64_t *, int,
                           int, int, int, int, int, float, void *, int);
typedef int (*SiluFn)(const void *, int64_t, int, void *, int);

typedef struct {
    NormFn add_rms_norm;
    BlockLinearFn block_linear;
    RotaryFn rotary;
    AttentionFn attention;
    SiluFn silu_mul;
} Kernels;

typedef struct {
    const void *attention_norm, *mlp_norm;
    const BlockWeights *qkv, *output, *gate_up, *down;  /* each BlockLinear's descriptor */
    char *keys, *values;  /* the layer's pool: [pool_blocks, block_size, kv_heads, head_dim] */
} Layer;

typedef struct {
    int num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size;
    int64_t pool_blocks;
    float eps, scale;
    int row_format;  /* the block products' `format` (block_weights.h): bfloat16 or float32 rows (the
                      * activations', norms' and pool's dtype too) and their int8 levels */
} Dims;

typedef struct {  /* the step's rows */
    int64_t rows;
    const void *cos, *sin;      /* [rows, head_dim] */
    const int64_t *slots;       /* [rows]: where each row's key and value go */
    const int64_t *tables;      /* [rows, width] */
    const int64_t *lens;        /* [rows] */
    int width;
} Step;

static int64_t qkv_width(const Dims *d) { return (int64_t)(d->heads + 2 * d->kv_heads) * d->head_dim; }

static int64_t element_bytes(const Dims *d) { return d->row_format == ROWS_BFLOAT16 ? 2 : 4; }

int64_t llama_decode_scratch_bytes(const Dims *d, int64_t rows) {
    int64_t widest = qkv_width(d) > 2 * (int64_t)d->intermediate ? qkv_width(d) : 2 * (int64_t)d->intermediate;
    /* hidden, qkv or gate/up, rotated q and k, q alone, attention out, gate */
    int64_t elements = rows * (d->hidden + widest + (int64_t)(d->heads + d->kv_heads) * d->head_dim
                               + 2 * (int64_t)d->heads * d->head_dim + d->intermediate);
    return elements * element_bytes(d);
}

static int linear(const Kernels *k, const Dims *d, const BlockWeights *w, const char *in, int64_t rows, char *out,
                  int threads) {
    return k->block_linear(in, d->row_format, rows, w, out, w->out_features, threads);
}

/* q/k/v, rotary, the keys and values into the pool, attention: the attention output [rows, heads * head_dim]. */
static int attend(const Kernels *k, const Dims *d, const Layer *l, const Step *s, const char *hidden, char *qkv,
                  char *rotated, char *q, char *out, int threads) {
    int64_t rows = s->rows, width = qkv_width(d), dim = d->head_dim, e = element_bytes(d);
    int64_t q_bytes = (int64_t)d->heads * dim * e, kv_bytes = (int64_t)d->kv_heads * dim * e;
    int status = linear(k, d, l->qkv, hidden, rows, qkv, threads);
    if (status == 0)  /* queries and keys side by side: one rotation for both, as the Python step */
        status = k->rotary(qkv, rows, d->heads + d->kv_heads, d->head_dim, width, s->cos, s->sin, rotated, threads);
    if (status != 0) return status;
    for (int64_t r = 0; r < rows; r++) {
        const char *row = rotated + r * (q_bytes + kv_bytes);
        if (s->slots[r] < 0 || s->slots[r] >= d->pool_blocks * d->block_size) return 3;
        memcpy(q + r * q_bytes, row, (size_t)q_bytes);
        memcpy(l->keys + s->slots[r] * kv_bytes, row + q_bytes, (size_t)kv_bytes);
        memcpy(l->values + s->slots[r] * kv_bytes, qkv + r * width * e + q_bytes + kv_bytes, (size_t)kv_bytes);
    }
    return k->attention(q, l->keys, l->values, d->pool_blocks, s->tables, s->lens, (int)rows, s->width, d->heads,
                        d->kv_heads, d->head_dim, d->block_size, d->scale, out, threads);
}

int llama_decode_stack(const Kernels *k, const Dims *d, const Layer *layers, const Step *s, void *x,
                       void *residual, void *scratch, int threads) {
    int64_t rows = s->rows, e = element_bytes(d);
    int64_t widest = qkv_width(d) > 2 * (int64_t)d->intermediate ? qkv_width(d) : 2 * (int64_t)d->intermediate;
    char *hidden = scratch, *wide = hidden + rows * d->hidden * e;
    char *rotated = wide + rows * widest * e, *q = rotated + rows * (d->heads + d->kv_heads) * d->head_dim * e;
    char *attended = q + rows * d->heads * d->head_dim * e, *gate = attended + rows * d->heads * d->head_dim * e;
    for (int i = 0; i < d->num_layers; i++) {
        const Layer *l = layers + i;
        /* the first layer normalizes the embeddings alone; the others add the last MLP's output first */
        int status = k->add_rms_norm(x, i == 0 ? NULL : residual, l->attention_norm, rows, d->hidden, d->eps,
                                     i == 0 ? NULL : x, hidden, threads);
        if (status == 0) status = attend(k, d, l, s, hidden, wide, rotated, q, attended, threads);
        if (status == 0) status = linear(k, d, l->output, attended, rows, residual, threads);
        if (status == 0)
            status = k->add_rms_norm(x, residual, l->mlp_norm, rows, d->hidden, d->eps, x, hidden, threads);
        if (status == 0) status = linear(k, d, l->gate_up, hidden, rows, wide, threads);
        if (status == 0) status = k->silu_mul(wide, rows, d->intermediate, gate, threads);
        if (status == 0) status = linear(k, d, l->down, gate, rows, residual, threads);
        if (status != 0) return status + 100 * (i + 1);
    }
    return 0;
}
