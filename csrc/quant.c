/* quant.c: which row functions of a weight type run (td_type_traits, for the SIMD level in use), which
   matrices are best interleaved at load (td_interleave), and an embedding look-up of any type
   (td_rows_to_f32). The functions themselves live one file an instruction-set family, as ggml
   splits its quants (ggml-quants.c, ggml-cpu/arch/x86/quants.c, arch/arm/quants.c):

     quant.h       the block formats, byte for byte ggml's, each documented beside its struct;
                   struct type_traits, what a kernel needs of a type
     quant_ref.c   plain C: every type's functions and the full table, td_traits_c (the reference)
     quant_x86.c   AVX2 and AVX-512 (with AVX512_VNNI): td_traits_avx2, td_traits_avx512
                   quant_x86_32.h its tiles of Q4_1, Q5_1, Q5_0 and IQ4_NL, once for AVX2 and VNNI
     quant_x86_k.c the same for the K-quants (Q2_K .. Q6_K, IQ4_XS, Q8_K): td_traits_avx2_k, _avx512_k
     quant_arm.c   NEON and dotprod: td_traits_neon, td_traits_dotprod
     quant_isa.h   the functions every instruction set has in the same shape (f16, bf16, Q8_0, Q4_0
                   rows; x to Q8_0), written once and instanced by each of the three files above

   A level's table names only the functions the level has of its own; at load each is merged over
   its base (plain C's; dotprod's over NEON's), so a type no level has sped up runs its plain-C
   functions everywhere, and a fast path is one function and one table entry in its family's file.
   A level's entry that names its own from_float names its whole x type (from_float, x_to_float,
   x_blck_size, x_type_size): the dot products of an entry all take the x its from_float makes. */
#include "quant.h"

/* each level's table merged over its base, made once at load */
#if defined(__x86_64__)
static struct type_traits traits_avx2[TD_NTYPES], traits_avx512[TD_NTYPES];
#elif defined(__aarch64__)
static struct type_traits traits_neon[TD_NTYPES], traits_dotprod[TD_NTYPES];
#endif

/* own's non-empty fields put in t, type by type */
static __attribute__((unused)) void overlay(struct type_traits *t, const struct type_traits *own)
{
    for (int i = 0; i < TD_NTYPES; i++) {
        const struct type_traits *o = &own[i];
        if (o->to_float)
            t[i].to_float = o->to_float;
        if (o->to_float_lane)
            t[i].to_float_lane = o->to_float_lane;
        if (o->from_float) {
            t[i].from_float = o->from_float, t[i].x_to_float = o->x_to_float;
            t[i].x_blck_size = o->x_blck_size, t[i].x_type_size = o->x_type_size;
        }
        if (o->vec_dot)
            t[i].vec_dot = o->vec_dot;
        if (o->vec_dot_4xn)
            t[i].vec_dot_4xn = o->vec_dot_4xn, t[i].tile_ahead = o->tile_ahead;
        if (o->vec_dot_8xn)
            t[i].vec_dot_8xn = o->vec_dot_8xn;
    }
}

__attribute__((constructor)) static void merge_tables(void)
{
#if defined(__x86_64__) /* quant_x86.c's and quant_x86_k.c's name different types */
    memcpy(traits_avx2, td_traits_c, sizeof traits_avx2);
    overlay(traits_avx2, td_traits_avx2), overlay(traits_avx2, td_traits_avx2_k);
    memcpy(traits_avx512, td_traits_c, sizeof traits_avx512);
    overlay(traits_avx512, td_traits_avx512), overlay(traits_avx512, td_traits_avx512_k);
#elif defined(__aarch64__)
    memcpy(traits_neon, td_traits_c, sizeof traits_neon);
    overlay(traits_neon, td_traits_neon);
    memcpy(traits_dotprod, traits_neon, sizeof traits_dotprod);
    overlay(traits_dotprod, td_traits_dotprod);
#endif
}

const struct type_traits *td_type_traits(enum td_type type)
{
#if defined(__x86_64__)
    const int needs = td_traits_avx512_needs[type] | td_traits_avx512_k_needs[type];
    if (td_simd == TD_SIMD_AVX512)
        return (td_simd_ext & needs) == needs ? &traits_avx512[type] : &traits_avx2[type];
    if (td_simd == TD_SIMD_AVX2)
        return &traits_avx2[type];
#elif defined(__aarch64__)
    if (td_simd == TD_SIMD_NEON)
        return td_simd_ext & TD_EXT_DOTPROD ? &traits_dotprod[type] : &traits_neon[type];
#endif
    return &td_traits_c[type];
}

int td_interleave(enum td_type type)
{
#if defined(__x86_64__)
    /* measured there (bench/README.md); NEON keeps its rows, AVX-512 without VNNI its own tiles */
    return (type == TD_Q8_0 || type == TD_Q4_0) &&
           (td_simd == TD_SIMD_AVX2 || (td_simd == TD_SIMD_AVX512 && (td_simd_ext & TD_EXT_VNNI)));
#else
    (void)type;
    return 0;
#endif
}

/* weight row j of w (row_bytes a row, k numbers) as f32: an interleaved type's from its group */
static void row_to_float(const struct type_traits *tt, const void *w, int64_t row_bytes, int64_t j, int64_t k,
                         float *y)
{
    const char *unit = (const char *)w + (j - j % tt->rows) * row_bytes; /* its group, or itself */
    if (tt->rows == 1)
        tt->to_float(unit, y, k);
    else
        tt->to_float_lane(unit, (int)(j % tt->rows), y, k);
}

int td_rows_to_f32(enum td_type type, const void *w, int64_t m, int64_t k, const int64_t *rows, int64_t n, float *y)
{
    const struct type_traits *tt = type == TD_F32 ? NULL : td_type_traits(type);
    const int64_t row_bytes = tt ? k / tt->blck_size * tt->type_size : 4 * k;
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= m)
            return -1;
    for (int64_t i = 0; i < n; i++) {
        if (tt)
            row_to_float(tt, w, row_bytes, rows[i], k, y + i * k);
        else
            memcpy(y + i * k, (const char *)w + rows[i] * row_bytes, (size_t)row_bytes);
    }
    return 0;
}