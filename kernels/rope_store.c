/* A CPU decode step's RoPE and K/V cache store, in one call (torch's ops of
 * fused.rope_store_torch, a multiply, a roll, a multiply, an add and two index_copy_, cost tens of
 * us a layer at SmolLM2's shapes, mostly dispatch): for each of the N tokens, its q and k heads
 * qk [nh + nkv, hd] (row stride qk_stride elements) rotated as
 *     out = x * cos + roll(x, hd / 2) * sin_signed
 * each product and the sum rounded to bfloat16 as torch rounds them (so the same bits as
 * rope_store_torch), the rotated q heads written to q_out [N, nh, hd], the rotated k heads and
 * the token's v heads [nkv, hd] (row stride v_stride) to its slot of the flat caches
 * [n_slots, nkv, hd]. cos, sin_signed: the tokens' rows [N, hd] (sin with its first half negated).
 * Returns -1, having written nothing, when a slot lies outside the caches. */
#include <stdint.h>
#include <string.h>
#include "bf16.h"

static inline void rotate(const uint16_t *x, const uint16_t *c, const uint16_t *s, int64_t hd, uint16_t *out) {
    const int64_t half = hd / 2;
    for (int64_t d = 0; d < hd; d++) {
        float a = bf16_to_f32(f32_to_bf16(bf16_to_f32(x[d]) * bf16_to_f32(c[d])));
        float r = bf16_to_f32(x[d < half ? d + half : d - half]);
        float b = bf16_to_f32(f32_to_bf16(r * bf16_to_f32(s[d])));
        out[d] = f32_to_bf16(a + b);
    }
}

int rope_store(const uint16_t *qk, int64_t qk_stride, const uint16_t *v, int64_t v_stride, const uint16_t *cos,
               const uint16_t *sin_signed, const int64_t *slots, int64_t N, int64_t nh, int64_t nkv, int64_t hd,
               int64_t n_slots, uint16_t *k_flat, uint16_t *v_flat, uint16_t *q_out) {
    for (int64_t t = 0; t < N; t++)
        if (slots[t] < 0 || slots[t] >= n_slots) return -1;
    for (int64_t t = 0; t < N; t++) {
        const uint16_t *x = qk + t * qk_stride, *c = cos + t * hd, *s = sin_signed + t * hd;
        for (int64_t h = 0; h < nh; h++) rotate(x + h * hd, c, s, hd, q_out + (t * nh + h) * hd);
        uint16_t *kd = k_flat + slots[t] * nkv * hd, *vd = v_flat + slots[t] * nkv * hd;
        for (int64_t h = 0; h < nkv; h++) rotate(x + (nh + h) * hd, c, s, hd, kd + h * hd);
        memcpy(vd, v + t * v_stride, (size_t)(nkv * hd) * sizeof(uint16_t));
    }
    return 0;
}
