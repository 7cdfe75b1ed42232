/* dot_isa.h: the f32 dot product for the kernels of one instruction set (see foreach_isa.h), one
   loop for all of them: a vector of VL sums, added up by halving, then the tail term by term; and
   vsums, the same halving of several such vectors at once. */

TARGET TD_INLINE float ISA(vec_dot_f32)(int64_t n, const float *x, const float *y)
{
    VEC acc = {0};
    int64_t i = 0;
    for (; i + VL <= n; i += VL)
        acc += vload(x + i) * vload(y + i);
    float s = vsum(acc);
    for (; i < n; i++)
        s += x[i] * y[i];
    return s;
}

/* the halves of x's and of y's groups of w lanes added, in one vector: the first halves of x's
   groups, then of y's, plus the second halves of each. From VL groups of one vector each, log2(VL)
   of these leave one vector whose lane i is vsum of vector i: the same additions, lane for lane */
TARGET TD_INLINE VEC ISA(halves)(VEC x, VEC y, const int w)
{
#if VL == 16
    switch (w) {
    case 16: return __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                    __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    case 8: return __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                   __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    case 4: return __builtin_shufflevector(x, y, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
                   __builtin_shufflevector(x, y, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    default: return __builtin_shufflevector(x, y, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
                    __builtin_shufflevector(x, y, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    }
#elif VL == 8
    switch (w) {
    case 8: return __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11) +
                   __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
    case 4: return __builtin_shufflevector(x, y, 0, 1, 4, 5, 8, 9, 12, 13) +
                   __builtin_shufflevector(x, y, 2, 3, 6, 7, 10, 11, 14, 15);
    default: return __builtin_shufflevector(x, y, 0, 2, 4, 6, 8, 10, 12, 14) +
                    __builtin_shufflevector(x, y, 1, 3, 5, 7, 9, 11, 13, 15);
    }
#else
    return w == 4 ? __builtin_shufflevector(x, y, 0, 1, 4, 5) + __builtin_shufflevector(x, y, 2, 3, 6, 7)
                  : __builtin_shufflevector(x, y, 0, 2, 4, 6) + __builtin_shufflevector(x, y, 1, 3, 5, 7);
#endif
}

/* s[i] = vsum(v[i]) for n <= VL vectors (n a constant after inlining), bit for bit: halves() two
   vectors at a time, the last paired with zeros where n is odd. One vector at a time, a third of a 4 x
   4 tile of k = 256 went to vsum's shuffles and scalar adds (AVX-512, Xeon, stories5m's bf16 matrices) */
TARGET TD_INLINE void ISA(vsums)(const VEC *v, const int n, float *s)
{
    VEC t[VL];
    int count = n;
    for (int i = 0; i < n; i++)
        t[i] = v[i];
    for (int w = VL; w > 1; w /= 2) {
        for (int i = 0; 2 * i < count; i++)
            t[i] = ISA(halves)(t[2 * i], 2 * i + 1 < count ? t[2 * i + 1] : (VEC){0}, w);
        count = (count + 1) / 2;
    }
    float sums[VL];
    vstore(sums, t[0]);
    for (int i = 0; i < n; i++)
        s[i] = sums[i];
}
