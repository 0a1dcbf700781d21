/* A CPU decode step's add + RMSNorm of a few bfloat16 rows, in one call (torch's two ops cost
 * ~15 us on a 576-wide row, mostly dispatch): s = x + d rounded to bfloat16 (d and s NULL: x's own norm),
 * h = s / sqrt(mean(s^2) + eps) * w rounded to bfloat16, the arithmetic of torch's rms_norm in
 * float32 (its sum of squares in another order: h may differ from it by a bfloat16 step).
 * add_rms_norm_reference in kernels/fused.py is the reference. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "bf16.h"

void add_rms_norm(const uint16_t *x, const uint16_t *d, const uint16_t *w, float eps, int64_t M, int64_t H,
                  uint16_t *s, uint16_t *h) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *xr = x + m * H, *dr = d ? d + m * H : NULL;
        uint16_t *sr = dr ? s + m * H : NULL, *hr = h + m * H;
        float part[16] = {0};
        for (int64_t i = 0; i < H; i++) {
            float v = dr ? bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[i]) + bf16_to_f32(dr[i]))) : bf16_to_f32(xr[i]);
            if (dr) sr[i] = f32_to_bf16(v);
            part[i & 15] += v * v;
        }
        float sum = 0.0f;
        for (int i = 0; i < 16; i++) sum += part[i];
        float r = 1.0f / sqrtf(sum / (float)H + eps);
        for (int64_t i = 0; i < H; i++) hr[i] = f32_to_bf16(bf16_to_f32(dr ? sr[i] : xr[i]) * r * bf16_to_f32(w[i]));
    }
}
