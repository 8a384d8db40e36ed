/* LoRA adapters' low-rank products added to a linear product's output, each row with its own adapter.
 *
 * For a product whose output is several modules side by side (q, k and v; gate and up), row r of
 * slot s > 0 (its adapter) gets, per module m the adapter adapts:
 *   t = bf16(A x_r)                  A: [rank, in] bfloat16 (PEFT's lora_A)
 *   y_r[offset_m:] = bf16(y_r + t Bt) Bt: [rank, width_m] bfloat16 (PEFT's scale * lora_B, transposed)
 * rounded where torch's `addmm(y, x A^T, B^T)` rounds them. Each row does only its own adapter's
 * work (a masked product over every adapter in the step would do all of theirs), in one call for
 * the whole product. Rows are shared among OpenMP threads when there is enough work.
 */
#include <stdlib.h>

#include "bf16_simd.h"

#define PARALLEL_WORK 2000000  /* multiply-adds below which one thread runs it all */
#define MAX_RANK 1024

#define ROW_BLOCK 4     /* rows of one adapter computed together: each weight load serves all of them */

/* t[j][k] = bf16(A[k] . x_j) for the block's rows j; in_features % 32 == 0. Always ROW_BLOCK rows (a
 * short block repeats its last row), so the accumulators stay in registers. */
static void shrink(const uint16_t *const *x, int in_features, const uint16_t *a, int rank,
                   float t[ROW_BLOCK][MAX_RANK]) {
    for (int k = 0; k < rank; k++) {
        const uint16_t *row = a + (int64_t)k * in_features;
        __m512 sum[ROW_BLOCK];
        for (int j = 0; j < ROW_BLOCK; j++) sum[j] = _mm512_setzero_ps();
        for (int i = 0; i < in_features; i += 32) {
            __m512bh weights = (__m512bh)_mm512_loadu_si512(row + i);
            for (int j = 0; j < ROW_BLOCK; j++)
                sum[j] = _mm512_dpbf16_ps(sum[j], weights, (__m512bh)_mm512_loadu_si512(x[j] + i));
        }
        for (int j = 0; j < ROW_BLOCK; j++) {
            uint32_t bits = (uint32_t)to_bf16(_mm512_reduce_add_ps(sum[j])) << 16;
            memcpy(&t[j][k], &bits, 4);
        }
    }
}

/* y_j[c] = bf16(y_j[c] + sum_k t[j][k] Bt[k][c]) for the block's rows j; width % 16 == 0. A repeated
 * row computes the same values from the same start and stores them twice. */
static void expand(uint16_t *const *y, const uint16_t *bt, int rank, int width, float t[ROW_BLOCK][MAX_RANK]) {
    for (int c = 0; c < width; c += 16) {
        __m512 acc[ROW_BLOCK];
        for (int j = 0; j < ROW_BLOCK; j++) acc[j] = widen16(y[j] + c);
        for (int k = 0; k < rank; k++) {
            __m512 weights = widen16(bt + (int64_t)k * width + c);
            for (int j = 0; j < ROW_BLOCK; j++) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(t[j][k]), weights, acc[j]);
        }
        for (int j = 0; j < ROW_BLOCK; j++)
            _mm256_storeu_si256((__m256i *)(y[j] + c), (__m256i)_mm512_cvtneps_pbh(acc[j]));
    }
}

/* x: [rows, in_features]; y: [rows, y_stride] (the product's output, updated in place); row_slots:
 * [rows] (0: no adapter); per slot s >= 1 and module m, at [(s - 1) * num_modules + m]: the
 * addresses of A and Bt (0: not adapted) and the rank; offsets/widths: each module's outputs. */
int lora_add_bf16(const uint16_t *x, int64_t rows, int in_features, const int32_t *row_slots, int num_slots,
                  const int64_t *a_addresses, const int64_t *bt_addresses, const int32_t *ranks,
                  const int32_t *offsets, const int32_t *widths, int num_modules, uint16_t *y, int64_t y_stride,
                  int num_threads) {
    if (in_features % 32 != 0 || rows < 0) return 1;
    int64_t work = 0;
    for (int m = 0; m < num_modules; m++) {
        if (widths[m] % 16 != 0) return 2;
        for (int s = 0; s < num_slots; s++) {
            int rank = ranks[s * num_modules + m];
            if (rank < 0 || rank > MAX_RANK) return 3;
            work += (int64_t)rank * (in_features + widths[m]);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        if (row_slots[r] < 0 || row_slots[r] > num_slots) return 4;
    work = work / (num_slots > 0 ? num_slots : 1) * rows;
    /* the rows of each slot, in order, cut into blocks of ROW_BLOCK: the blocks are the parallel work */
    int64_t *order = malloc(sizeof(int64_t) * (rows > 0 ? rows : 1));
    int64_t *block_starts = malloc(sizeof(int64_t) * (rows + 1));
    if (order == NULL || block_starts == NULL) { free(order); free(block_starts); return 5; }
    int64_t filled = 0, num_blocks = 0;
    for (int s = 1; s <= num_slots; s++) {
        int64_t first = filled;
        for (int64_t r = 0; r < rows; r++)
            if (row_slots[r] == s) order[filled++] = r;
        for (int64_t b = first; b < filled; b += ROW_BLOCK) block_starts[num_blocks++] = b;
    }
    block_starts[num_blocks] = filled;
#pragma omp parallel for num_threads(work >= PARALLEL_WORK ? num_threads : 1) schedule(dynamic, 1)
    for (int64_t b = 0; b < num_blocks; b++) {
        int64_t start = block_starts[b];
        int count = 0;
        const uint16_t *xs[ROW_BLOCK];
        uint16_t *ys[ROW_BLOCK];
        int slot = row_slots[order[start]];
        while (count < ROW_BLOCK && start + count < filled && row_slots[order[start + count]] == slot) {
            xs[count] = x + order[start + count] * in_features;
            ys[count] = y + order[start + count] * y_stride;
            count++;
        }
        for (int j = count; j < ROW_BLOCK; j++) {  /* a short block repeats its last row */
            xs[j] = xs[count - 1];
            ys[j] = ys[count - 1];
        }
        float t[ROW_BLOCK][MAX_RANK];
        for (int m = 0; m < num_modules; m++) {
            int index = (slot - 1) * num_modules + m;
            if (a_addresses[index] == 0) continue;
            uint16_t *outputs[ROW_BLOCK];
            for (int j = 0; j < ROW_BLOCK; j++) outputs[j] = ys[j] + offsets[m];
            shrink(xs, in_features, (const uint16_t *)a_addresses[index], ranks[index], t);
            expand(outputs, (const uint16_t *)bt_addresses[index], ranks[index], widths[m], t);
        }
    }
    free(order);
    free(block_starts);
    return 0;
}
