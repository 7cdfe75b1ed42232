/* dot_isa.h: the f32 dot product for the kernels of one instruction set (see foreach_isa.h), one
   loop for all of them: a vector of VL sums, added up by halving, then the tail term by term. */

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
