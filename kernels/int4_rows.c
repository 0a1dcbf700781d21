/* Columns of an int4 matrix (kernels/int4_weights.py's planes) as rows: an embedding that shares
 * a tied LM head's planes looks a token up as column `index` of the [K, N] matrix. Bit for bit
 * `int4_rows` in torch (float32: (q - 8) s + z a plane, the planes added in order), in one call
 * where torch's gather and unpack take about 20 ops. */
#include <stdint.h>
#include <string.h>
#include "bf16.h"

/* out [R, K] float32 = columns index[r] of the P planes (packed [N, P K / 2], sz [P K / 32, N, 2]). */
void int4_columns(const uint8_t *packed, const uint16_t *sz, int64_t K, int64_t P, int64_t N,
                  const int64_t *index, int64_t R, float *out) {
    for (int64_t r = 0; r < R; r++) {
        int64_t n = index[r], t = n / 64, j = n % 64, shift = j >= 32 ? 4 : 0;
        const uint8_t *tile = packed + t * 64 * P * K / 2;
        float *o = out + r * K;
        for (int64_t p = 0; p < P; p++) {
            for (int64_t k = 0; k < K; k++) {
                int64_t kk = p * K + k, g = kk / 32;
                int q = (tile[kk * 32 + (j & 31)] >> shift) & 15;
                float s = bf16_to_f32(sz[(g * N + n) * 2]), z = bf16_to_f32(sz[(g * N + n) * 2 + 1]);
                float v = ((float)q - 8.0f) * s + z;
                o[k] = p ? o[k] + v : v;
            }
        }
    }
}
