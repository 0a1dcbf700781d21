/* A CPU decode step's GLU, silu(gate) * up, of a few bfloat16 rows in one call (torch's chunk, silu
 * and mul cost ~9 us a layer at SmolLM2's shapes, mostly dispatch): gu [M, 2 I] (gate | up) ->
 * out [M, I], silu(g) = g / (1 + exp(-g)) in float32 rounded to bfloat16, then times up rounded to
 * bfloat16, as torch rounds them. exp is a polynomial within 1 ulp of expf (exp_poly.h), so an
 * output may differ from torch's by a bfloat16 step where a value lies on a rounding boundary;
 * fused.glu_reference is the reference. */
#include <stdint.h>
#include <string.h>
#include "bf16.h"
#include "exp_poly.h"

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
