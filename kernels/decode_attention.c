/* The attention of one decode row on the CPU, in one call (torch's eight ops of
 * paged_attention._attend_float32 cost ~80 us a layer at SmolLM2's shapes, mostly dispatch and
 * the float32 copies of the keys and values): q [nkv, g, hd] bfloat16 against the row's L keys
 * and values, read from a layer's flat cache [slots, nkv, hd] at slots start .. start + L - 1
 * (slots NULL) or at slots[0 .. L-1]. Per KV head: s = (q . k) / sqrt(hd) in float32,
 * p = softmax(s) in float32, out = p @ v rounded to bfloat16: the reference's arithmetic, its sums
 * in another order (out may differ from it by a bfloat16 step). Scratch: g * L floats. head_dim a
 * multiple of 16, at most 256; at most 16 query heads a KV head (else -1: the caller's torch path).
 * Where the compiler targets AVX-512 BF16 (and head_dim is a multiple of 32) the scores take the
 * bfloat16 dot-product instruction, 16 keys at a time, with no float32 copy of the keys; the
 * softmax's exp is exp_poly.h's (within 1 ulp of expf), so that its loop is vectorized. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "bf16.h"
#include "exp_poly.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_HD 256
#define MAX_G 16

static inline const uint16_t *row_at(const uint16_t *flat, const int64_t *slots, int64_t start, int64_t j,
                                     int64_t nkv, int64_t hd, int64_t h) {
    int64_t slot = slots ? slots[j] : start + j;
    return flat + (slot * nkv + h) * hd;
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define BF16_DOTS 1
/* r[j] = the sum of a[j]'s 16 lanes, j = 0 .. 15: pairs, quads, then 128-bit lanes combined */
static inline __m512 sum16(const __m512 *a) {
    __m512 b[8], c[4], d[2];
    for (int m = 0; m < 8; m++)
        b[m] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * m], a[2 * m + 1]), _mm512_unpackhi_ps(a[2 * m], a[2 * m + 1]));
    for (int m = 0; m < 4; m++)
        c[m] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * m], b[2 * m + 1], 0x44), _mm512_shuffle_ps(b[2 * m], b[2 * m + 1], 0xEE));
    for (int m = 0; m < 2; m++)
        d[m] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * m], c[2 * m + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * m], c[2 * m + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xDD));
}

/* The g queries' scores against the L keys of KV head h by the bfloat16 dot-product instruction
 * (products exact in float32, summed in float32), 16 keys at a time (hd a multiple of 32). */
static void scores_bf16(const uint16_t *qh, const uint16_t *k_flat, const int64_t *slots, int64_t start, int64_t L,
                        int64_t nkv, int64_t g, int64_t hd, int64_t h, float scale, float *scratch) {
    const int64_t nc = hd / 32;
    const __m512 sc = _mm512_set1_ps(scale);
    int64_t j0 = 0;
    for (; j0 + 16 <= L; j0 += 16) {
        const uint16_t *k[16];
        for (int jj = 0; jj < 16; jj++) k[jj] = row_at(k_flat, slots, start, j0 + jj, nkv, hd, h);
        for (int64_t i = 0; i < g; i++) {
            const uint16_t *qi = qh + i * hd;
            __m512 acc[16];
            for (int jj = 0; jj < 16; jj++) {
                __m512 a = _mm512_setzero_ps();
                for (int64_t c = 0; c < nc; c++)
                    a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(qi + 32 * c),
                                         (__m512bh)_mm512_loadu_si512(k[jj] + 32 * c));
                acc[jj] = a;
            }
            _mm512_storeu_ps(scratch + i * L + j0, _mm512_mul_ps(sum16(acc), sc));
        }
    }
    for (; j0 < L; j0++) {
        const uint16_t *kj = row_at(k_flat, slots, start, j0, nkv, hd, h);
        for (int64_t i = 0; i < g; i++) {
            __m512 a = _mm512_setzero_ps();
            for (int64_t c = 0; c < nc; c++)
                a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(qh + i * hd + 32 * c),
                                     (__m512bh)_mm512_loadu_si512(kj + 32 * c));
            scratch[i * L + j0] = _mm512_reduce_add_ps(a) * scale;
        }
    }
}
#endif

int decode_attention(const uint16_t *q, const uint16_t *k_flat, const uint16_t *v_flat, const int64_t *slots,
                     int64_t start, int64_t L, int64_t nkv, int64_t g, int64_t hd, float *scratch, uint16_t *out) {
    if (hd > MAX_HD || hd % 16 || g > MAX_G || L < 1) return -1;
    const float scale = 1.0f / sqrtf((float)hd);
    float qf[MAX_G][MAX_HD], row[MAX_HD], acc[MAX_G][MAX_HD]; /* row: a key, then a value */
    for (int64_t h = 0; h < nkv; h++) {
        for (int64_t i = 0; i < g; i++)
            for (int64_t d = 0; d < hd; d++) qf[i][d] = bf16_to_f32(q[(h * g + i) * hd + d]);
        /* scores, each key read once for the g queries of its head */
#ifdef BF16_DOTS
        if (hd % 32 == 0) {
            scores_bf16(q + h * g * hd, k_flat, slots, start, L, nkv, g, hd, h, scale, scratch);
        } else
#endif
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
#pragma omp simd reduction(max : m)
            for (int64_t j = 1; j < L; j++) m = s[j] > m ? s[j] : m;
#pragma omp simd
            for (int64_t j = 0; j < L; j++) s[j] = exp_poly(s[j] - m);
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < L; j++) sum += s[j];
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

/* R decode rows in one call: row r's query q + r nkv g hd against its lens[r] keys at
 * slots[r * stride .. r * stride + lens[r] - 1], into out + r nkv g hd. Each row is computed as
 * decode_attention computes it alone (the same bits whatever rows share the call); the rows are
 * split over `threads` OpenMP threads when built with OpenMP. Scratch: threads * g * max(lens)
 * floats. Returns 0, or -1 (a row decode_attention refuses). */
int decode_attention_rows(const uint16_t *q, const uint16_t *k_flat, const uint16_t *v_flat, const int64_t *slots,
                          int64_t stride, const int64_t *lens, int64_t R, int64_t nkv, int64_t g, int64_t hd,
                          float *scratch, uint16_t *out, int threads) {
    int64_t most = 0, per = nkv * g * hd;
    for (int64_t r = 0; r < R; r++) most = lens[r] > most ? lens[r] : most;
    int bad = 0;
    (void)threads;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) reduction(| : bad)
    for (int64_t r = 0; r < R; r++) {
        int me = 0;
#ifdef _OPENMP
        me = omp_get_thread_num();
#endif
        bad |= decode_attention(q + r * per, k_flat, v_flat, slots + r * stride, 0, lens[r], nkv, g, hd,
                                scratch + (int64_t)me * g * most, out + r * per) != 0;
    }
    return bad ? -1 : 0;
}
