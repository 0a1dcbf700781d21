/* The int4 matmul of a few activation rows (decode) over the CPU kernel's int4 planes
 * (kernels/int4_weights.py), with int8 activations: each row of x is quantized per group of 32
 * (scale d = max|x| / 127, q = x / d rounded to nearest even), then every group of every output
 * column is one integer dot product of the weights' 4-bit q with the activations' int8 q:
 *
 *     y[n] = sum over groups g of  s[g, n] (d_g sum_k q_w q_x - 8 t_g) + z[g, n] t_g,
 *     t_g = d_g sum_k q_x  (the group's activations as quantized, summed)
 *
 * (the weight is (q_w - 8) s + z). The planes' layout is torch's: rows of N in tiles of 64,
 * byte j of column k of a tile holding row j (low nibble) and row j + 32 (high nibble); a
 * matrix of P planes is P K columns, plane p multiplying the same x. int4_gemv_reference in
 * kernels/int4_gemv.py is this arithmetic in torch. Built with -march=native by
 * kernels/int4_gemv.py: AVX-512 VNNI (vpdpbusd), AVX-VNNI, AVX2 (vpmaddubsw) or plain C. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define GROUP 32
#define TILE 64
#ifndef ROWS_AT_ONCE
#if defined(__AVX512VL__)
#define ROWS_AT_ONCE 2 /* activation rows a tile's weights are unpacked for at once: two rows' 16 */
#else                  /* sums fit 32 vector registers beside the unpacked weights; with AVX2's 16 */
#define ROWS_AT_ONCE 1 /* (and with three or four rows) they spill, and the kernel is no faster */
#endif
#endif
#ifndef PREFETCH
#define PREFETCH 8 /* groups ahead */
#endif

/* One row of K bfloat16 -> K int8 q, the groups' d and t = d sum(q). */
static void quantize_row(const uint16_t *x, int64_t K, int8_t *q, float *d, float *t) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        float v[GROUP], amax = 0.0f;
        for (int i = 0; i < GROUP; i++) {
            v[i] = bf16_to_f32(x[g * GROUP + i]);
            float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
        }
        float dg = amax / 127.0f, id = dg != 0.0f ? 1.0f / dg : 0.0f;
        int sum = 0;
        for (int i = 0; i < GROUP; i++) {
            int qi = (int)nearbyintf(v[i] * id);
            q[g * GROUP + i] = (int8_t)qi;
            sum += qi;
        }
        d[g] = dg;
        t[g] = dg * (float)sum;
    }
}

/* sums[64] of one tile's group (32 columns of 32 bytes) times 32 int8 activations. */
#if defined(__AVX2__)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DOT(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__)
#define DOT(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#else
#define DOT(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#endif

/* sums[64] of one tile's group (32 columns of 32 bytes) times 32 int8 activations, for R rows
 * at once (row j's activations at xq + j * stride): each column's nibbles are unpacked once and
 * multiplied by every row's. A row's sums are the same integers whatever R is. */
static inline __attribute__((always_inline)) void tile_group(const uint8_t *b, const int8_t *xq, int64_t stride,
                                                             const int R, __m256i out[][8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i a[ROWS_AT_ONCE][8];
    for (int j = 0; j < R; j++)
        for (int i = 0; i < 8; i++) a[j][i] = _mm256_setzero_si256();
    for (int k = 0; k < GROUP; k += 4) {
        _mm_prefetch((const char *)(b + PREFETCH * 1024 + k * 32), _MM_HINT_T0);
        _mm_prefetch((const char *)(b + PREFETCH * 1024 + k * 32 + 64), _MM_HINT_T0);
        __m256i c0 = _mm256_loadu_si256((const __m256i *)(b + (k + 0) * 32));
        __m256i c1 = _mm256_loadu_si256((const __m256i *)(b + (k + 1) * 32));
        __m256i c2 = _mm256_loadu_si256((const __m256i *)(b + (k + 2) * 32));
        __m256i c3 = _mm256_loadu_si256((const __m256i *)(b + (k + 3) * 32));
        __m256i l01 = _mm256_unpacklo_epi8(c0, c1), h01 = _mm256_unpackhi_epi8(c0, c1);
        __m256i l23 = _mm256_unpacklo_epi8(c2, c3), h23 = _mm256_unpackhi_epi8(c2, c3);
        /* dwords of 4 columns; rows (lane 0 | lane 1): r0 j 0-3 | 16-19, r1 4-7 | 20-23,
         * r2 8-11 | 24-27, r3 12-15 | 28-31 (low nibbles), the same + 32 (high) */
        __m256i r[4] = {_mm256_unpacklo_epi16(l01, l23), _mm256_unpackhi_epi16(l01, l23),
                        _mm256_unpacklo_epi16(h01, h23), _mm256_unpackhi_epi16(h01, h23)};
        __m256i lo[4], hi[4];
        for (int i = 0; i < 4; i++) {
            lo[i] = _mm256_and_si256(r[i], m4);
            hi[i] = _mm256_and_si256(_mm256_srli_epi16(r[i], 4), m4);
        }
        for (int j = 0; j < R; j++) {
            int32_t xw;
            memcpy(&xw, xq + j * stride + k, 4);
            __m256i xs = _mm256_set1_epi32(xw);
            for (int i = 0; i < 4; i++) {
                a[j][i] = DOT(a[j][i], lo[i], xs);
                a[j][4 + i] = DOT(a[j][4 + i], hi[i], xs);
            }
        }
    }
    for (int j = 0; j < R; j++)
        for (int h = 0; h < 2; h++) { /* back to rows in order: 8 a register */
            __m256i *s = a[j] + 4 * h;
            out[j][4 * h + 0] = _mm256_permute2x128_si256(s[0], s[1], 0x20); /* 0-7 */
            out[j][4 * h + 1] = _mm256_permute2x128_si256(s[2], s[3], 0x20); /* 8-15 */
            out[j][4 * h + 2] = _mm256_permute2x128_si256(s[0], s[1], 0x31); /* 16-23 */
            out[j][4 * h + 3] = _mm256_permute2x128_si256(s[2], s[3], 0x31); /* 24-31 */
        }
}

/* One tile of 64 columns for R rows (row j's int8 activations at xq + j K, its groups' d and t
 * at d + j G, t + j G) into y[j * TILE ...]. Each row's float arithmetic, group after group,
 * is the same whatever R is: its bits do not depend on the rows beside it. */
static inline __attribute__((always_inline)) void tile_rows(const uint8_t *packed, const uint16_t *sz, int64_t N,
                                                            int64_t K, int64_t P, const int8_t *xq, const float *d,
                                                            const float *t, float *y, const int R) {
    __m256 acc[ROWS_AT_ONCE][8];
    for (int j = 0; j < R; j++)
        for (int i = 0; i < 8; i++) acc[j][i] = _mm256_setzero_ps();
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    int64_t G = K / GROUP;
    for (int64_t g = 0; g < P * G; g++) {
        __m256i s[ROWS_AT_ONCE][8];
        int64_t gx = g % G;
        tile_group(packed + g * GROUP * 32, xq + gx * GROUP, K, R, s);
        __m256 dg[ROWS_AT_ONCE], tg[ROWS_AT_ONCE], t8[ROWS_AT_ONCE]; /* each row's d and t of the group */
        for (int j = 0; j < R; j++) {
            dg[j] = _mm256_set1_ps(d[j * G + gx]), tg[j] = _mm256_set1_ps(t[j * G + gx]);
            t8[j] = _mm256_set1_ps(8.0f * t[j * G + gx]);
        }
        const uint16_t *row = sz + g * N * 2;
        if (g + PREFETCH < P * G) /* the (s, z) of a later group: a stride the hardware misses */
            for (int i = 0; i < 4; i++) _mm_prefetch((const char *)(row + PREFETCH * N * 2 + 32 * i), _MM_HINT_T0);
        for (int i = 0; i < 8; i++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(row + i * 16)); /* (s, z) of 8 rows */
            __m256 sc = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
            __m256 ze = _mm256_castsi256_ps(_mm256_and_si256(w, hi));
            for (int j = 0; j < R; j++) {
                __m256 v = _mm256_fmsub_ps(dg[j], _mm256_cvtepi32_ps(s[j][i]), t8[j]);
                acc[j][i] = _mm256_fmadd_ps(sc, v, _mm256_fmadd_ps(ze, tg[j], acc[j][i]));
            }
        }
    }
    for (int j = 0; j < R; j++)
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(y + j * TILE + 8 * i, acc[j][i]);
}

static void tile(const uint8_t *packed, const uint16_t *sz, int64_t N, int64_t K, int64_t P,
                 const int8_t *xq, const float *d, const float *t, float *y, int R) {
    if (R == ROWS_AT_ONCE)
        tile_rows(packed, sz, N, K, P, xq, d, t, y, ROWS_AT_ONCE);
    else
        for (int j = 0; j < R; j++) tile_rows(packed, sz, N, K, P, xq + j * K, d + j * (K / GROUP), t + j * (K / GROUP), y + j * TILE, 1);
}
#else
static void tile1(const uint8_t *packed, const uint16_t *sz, int64_t N, int64_t K, int64_t P,
                  const int8_t *xq, const float *d, const float *t, float *y) {
    float acc[TILE] = {0};
    int64_t G = K / GROUP;
    for (int64_t g = 0; g < P * G; g++) {
        int64_t gx = g % G;
        const uint8_t *b = packed + g * GROUP * 32;
        const uint16_t *row = sz + g * N * 2;
        for (int j = 0; j < TILE; j++) {
            int sum = 0;
            for (int k = 0; k < GROUP; k++) {
                uint8_t byte = b[k * 32 + (j & 31)];
                sum += (j < 32 ? byte & 15 : byte >> 4) * xq[gx * GROUP + k];
            }
            float v = d[gx] * (float)sum - 8.0f * t[gx];
            acc[j] = fmaf(bf16_to_f32(row[2 * j]), v, fmaf(bf16_to_f32(row[2 * j + 1]), t[gx], acc[j]));
        }
    }
    memcpy(y, acc, sizeof(acc));
}

static void tile(const uint8_t *packed, const uint16_t *sz, int64_t N, int64_t K, int64_t P,
                 const int8_t *xq, const float *d, const float *t, float *y, int R) {
    for (int j = 0; j < R; j++) tile1(packed, sz, N, K, P, xq + j * K, d + j * (K / GROUP), t + j * (K / GROUP), y + j * TILE);
}
#endif

/* y [M, N] bfloat16 = x [M, K] bfloat16 @ the planes (packed [N, P K / 2], sz [P K / 32, N, 2]
 * bfloat16), with x's rows quantized to int8; the tiles of N split over `threads` OpenMP threads
 * (torch's runtime: the process's one libgomp) when built with OpenMP. Returns 0, or -1 when out
 * of memory. */
int int4_gemv(const uint16_t *x, int64_t M, int64_t K, int64_t P, int64_t N, const uint8_t *packed,
              const uint16_t *sz, uint16_t *y, int threads) {
    int64_t G = K / GROUP;
    int8_t *xq = malloc((size_t)(M * K));
    float *d = malloc(sizeof(float) * (size_t)(M * G)), *t = malloc(sizeof(float) * (size_t)(M * G));
    if (!xq || !d || !t) {
        free(xq), free(d), free(t);
        return -1;
    }
    for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, K, xq + m * K, d + m * G, t + m * G);
    (void)threads;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t n0 = 0; n0 < N; n0 += TILE) {
        float out[ROWS_AT_ONCE * TILE];
        for (int64_t m = 0; m < M; m += ROWS_AT_ONCE) {
            int R = M - m < ROWS_AT_ONCE ? (int)(M - m) : ROWS_AT_ONCE;
            tile(packed + n0 * P * K / 2, sz + n0 * 2, N, K, P, xq + m * K, d + m * G, t + m * G, out, R);
            for (int r = 0; r < R; r++)
                for (int j = 0; j < TILE; j++) y[(m + r) * N + n0 + j] = f32_to_bf16(out[r * TILE + j]);
        }
    }
    free(xq), free(d), free(t);
    return 0;
}

/* Which path this build took (for messages and the tests). */
const char *int4_gemv_isa(void) {
#if defined(__AVX2__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "avx512-vnni";
#elif defined(__AVX2__) && defined(__AVXVNNI__)
    return "avx-vnni";
#elif defined(__AVX2__)
    return "avx2";
#else
    return "c";
#endif
}
