/* roofline_isa.h: the bandwidth loop for one instruction set (included by foreach_isa.h). */
#define VU TD_CAT(vu, VL) /* uint32 lanes, VEC's width */

/* sum mod 2^32 of x over tasks [b, e) (RD_BLOCK words each, the last one clipped to len), read
   a->reps times. ACC independent sums keep the loads, not the adds, the limit even from L1. */
TARGET static void ISA(read_sum)(void *ctx, int64_t b, int64_t e)
{
    struct rd *a = ctx;
    const uint32_t *x = a->x;
    int64_t begin = b * RD_BLOCK, end = e * RD_BLOCK < a->len ? e * RD_BLOCK : a->len;
    VU s[ACC] = {{0}};
    uint32_t sum = 0;
    for (int64_t r = 0; r < a->reps; r++) {
        int64_t j = begin;
        for (; j + ACC * VL <= end; j += ACC * VL)
            for (int i = 0; i < ACC; i++) {
                VU v;
                memcpy(&v, x + j + i * VL, sizeof v); /* one unaligned vector load */
                s[i] += v;
            }
        for (; j < end; j++)
            sum += x[j];
    }
    for (int i = 0; i < ACC; i++)
        for (int l = 0; l < VL; l++)
            sum += s[i][l];
    __atomic_fetch_add(&a->sum, sum, __ATOMIC_RELAXED); /* the slices finish in any order */
}
#undef VU
