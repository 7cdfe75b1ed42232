/* quant_x86_32.h: the dot products of Q4_1, Q5_1 (by Q8_1) and Q5_0, IQ4_NL (by Q8_0) on x86, in
   256-bit registers, written once and included by quant_x86.c twice: AVX2 (maddubs and madd) and
   AVX512_VNNI with AVX512_VL (vpdpbusd), under TARGET and ISA(name) as isa_instance.h does, VNNI
   saying which.

   They must give plain C's result to the bit (quant_ref.c: dot_q_1_q8_1, dot_q_0_q8_0), whose float
   steps are a serial chain per row: sum += t_b, one block after another, each t_b rounded on its
   own. What may change is everything around that chain. A tile is 4 weight rows by up to 4 x rows,
   two blocks a step:
   - the integer side: rows r0, r1 side by side in one register's two 128-bit halves (quants 0..15
     of a block in one register, 16..31 in another), r2, r3 in another, by x's quants 0..15 and
     16..31 broadcast to both halves (made once for the 4 rows); each half's 4 int32 lanes are one
     row's partial sums, and two hadds of the 4 such registers of the step's two blocks give the 8
     exact block sums in one register, lanes [r0b0 r2b0 r0b1 r2b1 | r1b0 r3b0 r1b1 r3b1];
   - the float side: those 8 sums' float steps at once, each lane its row's and block's own
     operations in plain C's order (IEEE operations are the same in any lane), then each row's
     chain takes block 0's term, then block 1's: 4 rows' (and N x rows') chains interleaved where
     plain C runs one, and the same numbers.
   Q4_1 and Q5_1 quants (0..31) are the unsigned side as they are (Q5_1: the fifth bits or'ed in);
   Q5_0 (q - 16) and IQ4_NL (the grid's values) are signed: the sign trick, |q| by x with q's sign
   (AVX2's maddubs would saturate on IQ4_NL's grid + 128). In int16 (AVX2), a pair's sum is at
   most 2 x 31 x 127 (2 x 127 x 127 for IQ4_NL, whose two halves go to int32 apart). */

#define T_Q4_1 0
#define T_Q5_1 1
#define T_Q5_0 2
#define T_IQ4_NL 3

/* the layout of type t's weight block and its x block */
#define W_BYTES(t) ((t) == T_Q4_1 ? sizeof(block_q4_1) : (t) == T_Q5_1 ? sizeof(block_q5_1) \
                    : (t) == T_Q5_0 ? sizeof(block_q5_0) : sizeof(block_iq4_nl))
#define W_QS(t) ((t) == T_Q4_1 ? 4 : (t) == T_Q5_1 ? 8 : (t) == T_Q5_0 ? 6 : 2) /* offset of qs */
#define W_QH(t) ((t) == T_Q5_1 ? 4 : 2)                                          /* of qh (Q5s) */
#define X_BYTES(t) ((t) <= T_Q5_1 ? sizeof(block_q8_1) : sizeof(block_q8_0))
#define X_QS(t) ((t) <= T_Q5_1 ? 4 : 2)

TARGET TD_INLINE int32_t ISA(load32)(const char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 8 words of 32 bits at offset off of blocks b0, b1 of rows w[0..3], in the sums' lane order */
TARGET TD_INLINE __m256i ISA(gather_words)(const char *const *w, int64_t b0, int64_t b1, int off)
{
    return _mm256_setr_epi32(ISA(load32)(w[0] + b0 + off), ISA(load32)(w[2] + b0 + off), ISA(load32)(w[0] + b1 + off),
                             ISA(load32)(w[2] + b1 + off), ISA(load32)(w[1] + b0 + off), ISA(load32)(w[3] + b0 + off),
                             ISA(load32)(w[1] + b1 + off), ISA(load32)(w[3] + b1 + off));
}

/* the low (hi 0) or high 16 bits of each of 8 words, as floats (f16) */
TARGET TD_INLINE __m256 ISA(halves)(__m256i words, const int hi)
{
    const __m256i pick = hi ? _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                               2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)
                            : _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(words, pick), _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(h));
}

/* two halves of x blocks b0, b1 in the sums' lanes: [h0 h0 h1 h1 | h0 h0 h1 h1] as floats */
TARGET TD_INLINE __m256 ISA(x_halves)(td_fp16_t h0, td_fp16_t h1)
{
    const uint64_t four = (uint64_t)h0 * 0x10001u | (uint64_t)h1 * 0x10001u << 32;
    return _mm256_cvtph_ps(_mm_set1_epi64x((long long)four));
}

/* the float term the chain adds, as plain C rounds each step (fixed: no fma) */
TARGET TD_INLINE __m256 ISA(fixed8)(__m256 v)
{
    __asm__("" : "+x"(v));
    return v;
}

/* one block's quants of rows a, b (halves), as the integer side wants them: lo = quants 0..15,
   hi = 16..31 (unsigned for Q4_1 and Q5_1; signed for Q5_0 and IQ4_NL) */
struct ISA(wpair) {
    __m256i lo, hi;
};

TARGET TD_INLINE struct ISA(wpair) ISA(w_pair)(const int t, const char *a, const char *b, __m128i qh4, int pa)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i n = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + W_QS(t)))),
                                              _mm_loadu_si128((const __m128i *)(b + W_QS(t))), 1);
    struct ISA(wpair) p = {_mm256_and_si256(n, m4), _mm256_and_si256(_mm256_srli_epi16(n, 4), m4)};
    if (t == T_IQ4_NL) {
        const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
        p.lo = _mm256_shuffle_epi8(grid, p.lo), p.hi = _mm256_shuffle_epi8(grid, p.hi);
    } else if (t != T_Q4_1) {
        /* qh4 holds the 4 rows' qh words; byte j of half h picks the qh byte of quant j (row pa + h) */
        const __m256i q = _mm256_broadcastsi128_si256(qh4);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        const char ra = (char)(4 * pa), rb = (char)(4 * pa + 4);
        const __m256i at_lo = _mm256_setr_epi8(ra, ra, ra, ra, ra, ra, ra, ra, ra + 1, ra + 1, ra + 1, ra + 1, ra + 1,
                                               ra + 1, ra + 1, ra + 1, rb, rb, rb, rb, rb, rb, rb, rb, rb + 1, rb + 1,
                                               rb + 1, rb + 1, rb + 1, rb + 1, rb + 1, rb + 1);
        const __m256i at_hi = _mm256_add_epi8(at_lo, _mm256_set1_epi8(2));
        const __m256i set_lo = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(q, at_lo), bit), bit);
        const __m256i set_hi = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(q, at_hi), bit), bit);
        if (t == T_Q5_1) { /* q = nibble + 16 where the bit is set */
            p.lo = _mm256_or_si256(p.lo, _mm256_and_si256(set_lo, _mm256_set1_epi8(16)));
            p.hi = _mm256_or_si256(p.hi, _mm256_and_si256(set_hi, _mm256_set1_epi8(16)));
        } else { /* q - 16 = the nibble with 0xF0 where the bit is clear */
            p.lo = _mm256_or_si256(p.lo, _mm256_andnot_si256(set_lo, _mm256_set1_epi8((char)0xF0)));
            p.hi = _mm256_or_si256(p.hi, _mm256_andnot_si256(set_hi, _mm256_set1_epi8((char)0xF0)));
        }
    }
    return p;
}

/* u (unsigned bytes) . s (signed), each half's 4 int32 lanes its partial sums; add: two such */
TARGET TD_INLINE __m256i ISA(udot)(__m256i u0, __m256i s0, __m256i u1, __m256i s1, const int wide)
{
#if VNNI
    (void)wide;
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, s0), u1, s1);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (wide) /* each maddubs's pairs to int32 on its own (IQ4_NL: two could overflow int16) */
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u0, s0), ones),
                                _mm256_madd_epi16(_mm256_maddubs_epi16(u1, s1), ones));
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)), ones);
#endif
}

/* rows (a, b) of a pair by x's two broadcast halves */
TARGET TD_INLINE __m256i ISA(pair_dot)(const int t, struct ISA(wpair) p, __m256i xlo, __m256i xhi)
{
    if (t <= T_Q5_1)
        return ISA(udot)(p.lo, xlo, p.hi, xhi, 0);
    return ISA(udot)(_mm256_sign_epi8(p.lo, p.lo), _mm256_sign_epi8(xlo, p.lo), _mm256_sign_epi8(p.hi, p.hi),
                     _mm256_sign_epi8(xhi, p.hi), t == T_IQ4_NL);
}

/* x block b's quants 0..15 (h 0) or 16..31 in both halves */
TARGET TD_INLINE __m256i ISA(x_half)(const int t, const char *x, int64_t b, int h)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(x + b * X_BYTES(t) + X_QS(t) + 16 * h)));
}

/* the 4 rows' qh words of block b */
TARGET TD_INLINE __m128i ISA(qh4)(const int t, const char *const *w, int64_t b)
{
    const int64_t o = b + W_QH(t);
    return _mm_setr_epi32(ISA(load32)(w[0] + o), ISA(load32)(w[1] + o), ISA(load32)(w[2] + o), ISA(load32)(w[3] + o));
}

/* y[n*ldy + r] = row r . x row n, r < 4, n < N: blocks b0, b1 a step (b1 = b0 for an odd last
   block, whose second term is not added) */
TARGET TD_INLINE void ISA(tile32)(const int t, const int N, int64_t k, const char *vw, int64_t row_bytes,
                                  const char *vx, int64_t x_bytes, float *y, int64_t ldy)
{
    const char *w[4] = {vw, vw + row_bytes, vw + 2 * row_bytes, vw + 3 * row_bytes};
    const int64_t nb = k / QK8_0, wbytes = W_BYTES(t);
    __m256 acc[4];
    for (int n = 0; n < N; n++)
        acc[n] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i += 2) {
        const int two = i + 1 < nb;
        const int64_t b0 = i * wbytes, b1 = (two ? i + 1 : i) * wbytes;
        struct ISA(wpair) p[2][2]; /* [block][row pair] */
        for (int j = 0; j < 2; j++) {
            const int64_t o = j ? b1 : b0;
            const __m128i qh = t == T_Q5_0 || t == T_Q5_1 ? ISA(qh4)(t, w, o) : _mm_setzero_si128();
            p[j][0] = ISA(w_pair)(t, w[0] + o, w[1] + o, qh, 0);
            p[j][1] = ISA(w_pair)(t, w[2] + o, w[3] + o, qh, 2);
        }
        const __m256i dm = ISA(gather_words)(w, b0, b1, 0); /* d, and m for Q4_1 and Q5_1 */
        const __m256 dw = ISA(halves)(dm, 0);
        const __m256 mw = t <= T_Q5_1 ? ISA(halves)(dm, 1) : _mm256_setzero_ps();
        for (int n = 0; n < N; n++) {
            const char *x = vx + n * x_bytes;
            const int64_t i1 = two ? i + 1 : i;
            __m256i h[2];
            for (int j = 0; j < 2; j++) {
                const int64_t b = j ? i1 : i;
                const __m256i xlo = ISA(x_half)(t, x, b, 0), xhi = ISA(x_half)(t, x, b, 1);
                h[j] = _mm256_hadd_epi32(ISA(pair_dot)(t, p[j][0], xlo, xhi), ISA(pair_dot)(t, p[j][1], xlo, xhi));
            }
            const __m256 sums = _mm256_cvtepi32_ps(_mm256_hadd_epi32(h[0], h[1]));
            const td_fp16_t *xd0 = (const td_fp16_t *)(x + i * X_BYTES(t)), *xd1 = (const td_fp16_t *)(x + i1 * X_BYTES(t));
            __m256 term = ISA(fixed8)(_mm256_mul_ps(_mm256_mul_ps(dw, ISA(x_halves)(xd0[0], xd1[0])), sums));
            if (t <= T_Q5_1) /* + m_w s_x, rounded on its own, then the block's two terms summed */
                term = _mm256_add_ps(term, ISA(fixed8)(_mm256_mul_ps(mw, ISA(x_halves)(xd0[1], xd1[1]))));
            acc[n] = _mm256_add_ps(acc[n], ISA(fixed8)(term));
            if (two) /* block 1's terms into block 0's lanes */
                acc[n] = _mm256_add_ps(acc[n], ISA(fixed8)(_mm256_permute_ps(term, _MM_SHUFFLE(3, 2, 3, 2))));
        }
    }
    for (int n = 0; n < N; n++) { /* lanes 0, 1, 4, 5: rows 0, 2, 1, 3 */
        float a[8];
        _mm256_storeu_ps(a, acc[n]);
        y[n * ldy] = a[0], y[n * ldy + 1] = a[4], y[n * ldy + 2] = a[1], y[n * ldy + 3] = a[5];
    }
}

/* vec_dot_4xn and vec_dot (the tile with one row four times) of each type */
#define TILE32(name, t)                                                                                     \
    TARGET static void ISA(vec_dot_4xn_##name)(int64_t k, const void *w, int64_t row_bytes, const void *x,   \
                                               int64_t x_bytes, int nx, float *y, int64_t ldy)              \
    {                                                                                                       \
        switch (nx) {                                                                                       \
        case 1: ISA(tile32)(t, 1, k, w, row_bytes, x, x_bytes, y, ldy); break;                              \
        case 2: ISA(tile32)(t, 2, k, w, row_bytes, x, x_bytes, y, ldy); break;                              \
        case 3: ISA(tile32)(t, 3, k, w, row_bytes, x, x_bytes, y, ldy); break;                              \
        default: ISA(tile32)(t, 4, k, w, row_bytes, x, x_bytes, y, ldy); break;                             \
        }                                                                                                   \
    }                                                                                                       \
    TARGET static float ISA(vec_dot_##name)(int64_t k, const void *w, const void *x)                        \
    {                                                                                                       \
        float y[4];                                                                                         \
        ISA(tile32)(t, 1, k, w, 0, x, 0, y, 1);                                                             \
        return y[0];                                                                                        \
    }
TILE32(q4_1_q8_1, T_Q4_1)
TILE32(q5_1_q8_1, T_Q5_1)
TILE32(q5_0_q8_0, T_Q5_0)
TILE32(iq4_nl_q8_0, T_IQ4_NL)
#undef TILE32

#undef T_Q4_1
#undef T_Q5_1
#undef T_Q5_0
#undef T_IQ4_NL
#undef W_BYTES
#undef W_QS
#undef W_QH
#undef X_BYTES
#undef X_QS
