/* The attention of one decode row on the CPU, in one call (torch's eight ops of
 * paged_attention._attend_float32 cost ~80 us a layer at SmolLM2's shapes, mostly dispatch and
 * the float32 copies of the keys and values): q [nkv, g, hd] bfloat16 against the row's L keys
 * and values, read from a layer's flat cache [slots, nkv, hd] at slots start .. start + L - 1
 * (slots NULL) or at slots[0 .. L-1]. Per KV head: s = (q . k) / sqrt(hd) in float32,
 * p = softmax(s) in float32, out = p @ v rounded to bfloat16: the reference's arithmetic, its sums
 * in another order (out may differ from it by a bfloat16 step). Scratch: g * L floats. head_dim a
 * multiple of 16, at most 256; at most 16 query heads a KV head (else -1: the caller's torch path). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "bf16.h"

#define MAX_HD 256
#define MAX_G 16

static inline const uint16_t *row_at(const uint16_t *flat, const int64_t *slots, int64_t start, int64_t j,
                                     int64_t nkv, int64_t hd, int64_t h) {
    int64_t slot = slots ? slots[j] : start + j;
    return flat + (slot * nkv + h) * hd;
}

int decode_attention(const uint16_t *q, const uint16_t *k_flat, const uint16_t *v_flat, const int64_t *slots,
                     int64_t start, int64_t L, int64_t nkv, int64_t g, int64_t hd, float *scratch, uint16_t *out) {
    if (hd > MAX_HD || hd % 16 || g > MAX_G || L < 1) return -1;
    const float scale = 1.0f / sqrtf((float)hd);
    float qf[MAX_G][MAX_HD], row[MAX_HD], acc[MAX_G][MAX_HD]; /* row: a key, then a value */
    for (int64_t h = 0; h < nkv; h++) {
        for (int64_t i = 0; i < g; i++)
            for (int64_t d = 0; d < hd; d++) qf[i][d] = bf16_to_f32(q[(h * g + i) * hd + d]);
        /* scores, each key read once for the g queries of its head */
        for (int64_t j = 0; j < L; j++) {
            const uint16_t *k = row_at(k_flat, slots, start, j, nkv, hd, h);
            for (int64_t d = 0; d < hd; d++) row[d] = bf16_to_f32(k[d]);
            for (int64_t i = 0; i < g; i++) {
                float s = 0.0f; /* the compiler's vector lanes, summed at the end */
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < hd; d++) s += qf[i][d] * row[d];
                scratch[i * L + j] = s * scale;
            }
        }
        /* softmax of each query's scores */
        for (int64_t i = 0; i < g; i++) {
            float *s = scratch + i * L, m = s[0], sum = 0.0f;
            for (int64_t j = 1; j < L; j++) m = s[j] > m ? s[j] : m;
            for (int64_t j = 0; j < L; j++) {
                s[j] = expf(s[j] - m);
                sum += s[j];
            }
            float inv = 1.0f / sum;
            for (int64_t j = 0; j < L; j++) s[j] *= inv;
            for (int64_t d = 0; d < hd; d++) acc[i][d] = 0.0f;
        }
        /* p @ v, each value row read once */
        for (int64_t j = 0; j < L; j++) {
            const uint16_t *v = row_at(v_flat, slots, start, j, nkv, hd, h);
            for (int64_t d = 0; d < hd; d++) row[d] = bf16_to_f32(v[d]);
            for (int64_t i = 0; i < g; i++) {
                float p = scratch[i * L + j];
                for (int64_t d = 0; d < hd; d++) acc[i][d] += p * row[d];
            }
        }
        for (int64_t i = 0; i < g; i++)
            for (int64_t d = 0; d < hd; d++) out[(h * g + i) * hd + d] = f32_to_bf16(acc[i][d]);
    }
    return 0;
}
