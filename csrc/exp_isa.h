/* exp_isa.h: e^x on a vector, for the kernels of one instruction set (see foreach_isa.h).

   Cephes' expf: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-7 polynomial, 2^n built in the
   exponent bits. Relative error ~2e-7, like libm's expf but VL lanes at a time. Lanes below
   -87.33 (including -inf) give 0, above 88.37 give inf; NaN stays NaN. */
#define VI TD_CAT(vi, VL) /* int32 lanes, VEC's width: comparisons give -1 (true) or 0 per lane */

TARGET TD_INLINE VEC ISA(vselect)(VI mask, VEC a, VEC b) /* mask ? a : b, lane by lane */
{
    return (VEC)((mask & (VI)a) | (~mask & (VI)b));
}

/* a > b ? a : b, lane by lane (NaN: b): on x86 one maxps, where the select takes three */
#if defined(__x86_64__) && VL == 16
TARGET TD_INLINE VEC ISA(vmax)(VEC a, VEC b) { return (VEC)_mm512_max_ps((__m512)a, (__m512)b); }
#elif defined(__x86_64__) && VL == 8
TARGET TD_INLINE VEC ISA(vmax)(VEC a, VEC b) { return (VEC)_mm256_max_ps((__m256)a, (__m256)b); }
#elif defined(__x86_64__)
TARGET TD_INLINE VEC ISA(vmax)(VEC a, VEC b) { return (VEC)_mm_max_ps((__m128)a, (__m128)b); }
#else
TARGET TD_INLINE VEC ISA(vmax)(VEC a, VEC b) { return ISA(vselect)(a > b, a, b); }
#endif

TARGET TD_INLINE VEC ISA(vexp)(VEC x)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer in the low bits */
    VI under = x < -87.33654f, over = x > 88.37626f;
    x = ISA(vselect)(under | over, (VEC){0}, x);
    VEC t = x * 1.44269504088896341f + magic; /* n = round(x / ln2), in the low bits of t */
    VEC n = t - magic;
    VEC r = x - n * 0.693359375f + n * 2.12194440e-4f; /* x - n ln2, ln2 in two parts */
    VEC p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    VEC pow2n = (VEC)(((VI)t - 0x4B400000 + 127) << 23); /* 0x4B400000: the bits of magic */
    VEC y = p * pow2n;
    y = ISA(vselect)(under, (VEC){0}, y);
    return ISA(vselect)(over, (VEC){0} + __builtin_inff(), y);
}
#undef VI
