/* A CPU decode step's GLU, silu(gate) * up, of a few bfloat16 rows in one call (torch's chunk, silu
 * and mul cost ~9 us a layer at SmolLM2's shapes, mostly dispatch): gu [M, 2 I] (gate | up) ->
 * out [M, I], silu(g) = g / (1 + exp(-g)) in float32 rounded to bfloat16, then times up rounded to
 * bfloat16, as torch rounds them. exp is a polynomial within 1 ulp of expf (see exp_poly), so an
 * output may differ from torch's by a bfloat16 step where a value lies on a rounding boundary;
 * fused.glu_reference is the reference. */
#include <stdint.h>
#include <string.h>
#include "bf16.h"

/* exp(x): +inf past 88, 2^-126 below -87, else (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6
 * polynomial in r, 2^n from the exponent bits), branch-free so that its loops are vectorized */
static inline float exp_poly(float x) {
    float big = x > 88.0f ? __builtin_inff() : 0.0f; /* (exp overflows past 88.72) */
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &e, 4);
    return big != 0.0f ? big : p * two_n;
}

void glu_silu(const uint16_t *gu, int64_t M, int64_t I, uint16_t *out) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *g = gu + m * 2 * I, *u = g + I;
        uint16_t *o = out + m * I;
#pragma omp simd
        for (int64_t i = 0; i < I; i++) {
            float x = bf16_to_f32(g[i]);
            float s = bf16_to_f32(f32_to_bf16(x / (1.0f + exp_poly(-x))));
            o[i] = f32_to_bf16(s * bf16_to_f32(u[i]));
        }
    }
}
