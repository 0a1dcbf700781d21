/* exp(x) in float32 for the CPU kernels' C sources (decode_attention.c, glu.c): Cephes' expf,
 * x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial in r, 2^n from the exponent bits.
 * Within 1 ulp of expf on every float of [-87, 88] (checked exhaustively against exp in double);
 * +inf past 88, 2^-126 below -87. Branch-free, so that the loops calling it are vectorized. */
#ifndef DEEPINFER_EXP_POLY_H
#define DEEPINFER_EXP_POLY_H
#include <stdint.h>
#include <string.h>

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
#endif
