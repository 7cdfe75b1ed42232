/* quant_x86_32.h: the dot products of Q4_1, Q5_1 (by Q8_1) and Q5_0, IQ4_NL (by Q8_0) on x86,
   written once and included by quant_x86.c twice under TARGET and ISA(name), as isa_instance.h
   does: AVX2 (VNNI 0: 256-bit registers, maddubs and madd) and AVX512_VNNI (VNNI 1: zmm,
   vpdpbusd).

   They must give plain C's result to the bit (quant_ref.c: dot_q_1_q8_1, dot_q_0_q8_0), whose float
   steps are a serial chain per row: sum += t_b, one block after another, each t_b rounded on its
   own. What may change is everything around that chain: a tile is 4 weight rows by up to 4 x
   rows, whose block sums are made exact in integer registers for several blocks of the 4 rows at
   once and put into one register's lanes, one lane a (row, block); then each lane's float steps
   are its row's and block's own operations in plain C's order (IEEE operations are the same in
   any lane), and each row's chain takes its blocks' terms in block order: 4 rows' (and N x rows')
   chains run interleaved where plain C runs one, to the same numbers. vec_dot is the tile with one
   row four times.

   AVX2, two blocks a step: rows r0, r1 side by side in one register's two 128-bit halves (a
   block's quants 0..15 in one register, 16..31 in another), r2, r3 in another, by x's quants 0..15
   and 16..31 broadcast to both halves (made once for the 4 rows); each half's 4 int32 lanes are
   one row's partial sums, and two hadds of the 4 such registers of the step's two blocks give the
   8 block sums in one register, lanes [r0b0 r2b0 r0b1 r2b1 | r1b0 r3b0 r1b1 r3b1]. The quants of
   Q4_1, Q5_1 and Q5_0 (0..31; Q5: the fifth bits or'ed in) are the unsigned side as they are, and
   Q5_0's sums then less 16 . x (from x's sums, Q8_0S); IQ4_NL's (the grid's values) are signed:
   the sign trick, |q| by x with q's sign (maddubs would saturate on the grid + 128). In int16, a
   pair's sum is at most 2 x 31 x 127 (2 x 127 x 127 for IQ4_NL, whose two halves go to int32
   apart). */

#define T_Q4_1 0
#define T_Q5_1 1
#define T_Q5_0 2
#define T_IQ4_NL 3

/* the layout of type t's weight block and its x block */
#define W_BYTES(t) ((t) == T_Q4_1 ? sizeof(block_q4_1) : (t) == T_Q5_1 ? sizeof(block_q5_1) \
                    : (t) == T_Q5_0 ? sizeof(block_q5_0) : sizeof(block_iq4_nl))
#define W_QS(t) ((t) == T_Q4_1 ? 4 : (t) == T_Q5_1 ? 8 : (t) == T_Q5_0 ? 6 : 2) /* offset of qs */
#define W_QH(t) ((t) == T_Q5_1 ? 4 : 2)                                          /* of qh (Q5s) */
/* x: Q8_1 for Q4_1 and Q5_1; Q8_0S (Q8_0 with its sum) for Q5_0, and for IQ4_NL on VNNI (Q8_0 on
   AVX2); Q8_1 and Q8_0S lay out d, a word, then the quants alike */
#define X_BYTES(t) ((t) == T_IQ4_NL && !VNNI ? sizeof(block_q8_0) : sizeof(block_q8_1))
#define X_QS(t) ((t) == T_IQ4_NL && !VNNI ? 2 : 4)

TARGET TD_INLINE int32_t ISA(load32)(const char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if !VNNI

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
        /* q = nibble + 16 where the bit is set (Q5_0's q - 16: its 16 . x taken off the sums) */
        p.lo = _mm256_or_si256(p.lo, _mm256_and_si256(set_lo, _mm256_set1_epi8(16)));
        p.hi = _mm256_or_si256(p.hi, _mm256_and_si256(set_hi, _mm256_set1_epi8(16)));
    }
    return p;
}

/* u (unsigned bytes) . s (signed), each half's 4 int32 lanes its partial sums; add: two such */
TARGET TD_INLINE __m256i ISA(udot)(__m256i u0, __m256i s0, __m256i u1, __m256i s1, const int wide)
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (wide) /* each maddubs's pairs to int32 on its own (IQ4_NL: two could overflow int16) */
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u0, s0), ones),
                                _mm256_madd_epi16(_mm256_maddubs_epi16(u1, s1), ones));
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)), ones);
}

/* rows (a, b) of a pair by x's two broadcast halves */
TARGET TD_INLINE __m256i ISA(pair_dot)(const int t, struct ISA(wpair) p, __m256i xlo, __m256i xhi)
{
    if (t != T_IQ4_NL)
        return ISA(udot)(p.lo, xlo, p.hi, xhi, 0);
    return ISA(udot)(_mm256_sign_epi8(p.lo, p.lo), _mm256_sign_epi8(xlo, p.lo), _mm256_sign_epi8(p.hi, p.hi),
                     _mm256_sign_epi8(xhi, p.hi), 1);
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
            __m256i isum = _mm256_hadd_epi32(h[0], h[1]);
            const td_fp16_t *xd0 = (const td_fp16_t *)(x + i * X_BYTES(t)), *xd1 = (const td_fp16_t *)(x + i1 * X_BYTES(t));
            if (t == T_Q5_0) { /* 16 . x of blocks i, i1 (Q8_0S's sums), lanes [i i i1 i1 | ...] */
                const uint64_t both = (uint32_t)(int32_t)(int16_t)xd0[1] | (uint64_t)(uint32_t)(int32_t)(int16_t)xd1[1] << 32;
                const __m256i xs = _mm256_shuffle_epi32(_mm256_set1_epi64x((long long)both), _MM_SHUFFLE(1, 1, 0, 0));
                isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(xs, 4));
            }
            const __m256 sums = _mm256_cvtepi32_ps(isum);
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

#else
/* AVX512_VNNI: a tile is 4 weight rows by up to 4 x rows, four blocks a step, rows r0..r3 in the
   four 128-bit lanes of a zmm (a block's quants 0..15 in one zmm, 16..31 in another) by x's
   halves broadcast to all four; vpdpbusd takes the weights as the unsigned side: Q4_1 and Q5_1 as
   they are, Q5_0 as q (0..31) and IQ4_NL as its grid + 128, each sum then less 16 (128) . x. A
   4 x 4 transpose of the step's four sums (unpacks and adds) gives the 16 exact block sums in one
   zmm, lane 4r + j for row r's block i + j; the weights' scales come in that order by one gather
   and Q5's fifth bits by another (the next step's gathered before this step's work, to hide
   their latency: 55 -> 51 us a 640 x 2048 Q5_0 decode matmul, one thread), whose bits pshufb and
   vptestmb make byte masks. Then the float steps as AVX2's, and each row's chain takes the step's
   four terms in block order. A tail of nb % 4 blocks runs the same step with its blocks past the
   last clamped to it, their terms not added. Q5_0's and IQ4_NL's x is Q8_0S, whose sums of
   quants give the offset's product with x for 4 blocks in one shift. */

/* On Intel the tile brings its rows' bytes into the cache itself, spread over its steps, where
   elsewhere matmul.c prefetches a tile's rows all at once before it (PREFETCH_BYTES ahead): the
   Xeon takes fewer misses at once than a tile has lines (23 for 4 rows of Q4_1 at k = 576), so that
   burst stalled the core until the first of them came back, and with one x row the tile's own work
   did not hide it (perf, SmolLM2-135M Q4_1 decode: 60% of the Q4_1 matmuls' time on the
   prefetches). Each step asks for two lines of each row AHEAD_L2 on into L2 and AHEAD_L1 on into
   L1, which then come from L2 and hold a miss's place briefly. Xeon, 2 threads, the other core busy
   with other work (so mostly one), the SmolLM2-135M Q4_1 file's 1- and 2-row passes, medians of
   interleaved rounds: the burst 12.12, 13.32 ms against two lines 4096 on into L1 alone 11.10,
   12.12 (4096-12288 ahead alike, 2048 1.06x slower); those 10.80, 12.02 against these two
   distances 9.69, 11.12. */
#define AHEAD_L1 2048
#define AHEAD_L2 12288

TARGET TD_INLINE __m512 ISA(fixed16)(__m512 v)
{
    __asm__("" : "+v"(v));
    return v;
}

/* block b's 16 bytes at offset off of the 4 rows, row r in lane r */
TARGET TD_INLINE __m512i ISA(rows16)(const char *const *w, int64_t b, int64_t off)
{
    const __m256i a = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w[0] + b + off))),
                                              _mm_loadu_si128((const __m128i *)(w[1] + b + off)), 1);
    const __m256i c = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w[2] + b + off))),
                                              _mm_loadu_si128((const __m128i *)(w[3] + b + off)), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
}

/* the words at offset 0 (d, and m for Q4_1 and Q5_1) and the qh (Q5) of row r's block j at lane 4r
   + j, gidx their offsets from w0 */
TARGET TD_INLINE void ISA(gather32)(const int t, const char *w0, __m512i gidx, __m512i *words, __m512i *qh)
{
    *words = _mm512_i32gather_epi32(gidx, w0, 1);
    *qh = t == T_Q5_0 || t == T_Q5_1 ? _mm512_i32gather_epi32(gidx, w0 + W_QH(t), 1) : _mm512_setzero_si512();
}

/* the step: blocks j < cnt from w[r] (row r's block i) and x[n] (x row n's), 4 rows by N x rows;
   blocks past cnt read block cnt - 1 (their terms are not added); gidx: row r's block j at lane
   4r + j, from w[0] */
TARGET TD_INLINE void ISA(step32)(const int t, const int N, const int cnt, const char *const *w, __m512i words,
                                  __m512i qh, const char *const *x, __m512 *acc)
{
    const int64_t wbytes = W_BYTES(t), xbytes = X_BYTES(t);
    const __m512i m4 = _mm512_set1_epi8(15);
    int64_t blk[4]; /* the blocks read, from block i */
    for (int j = 0; j < 4; j++)
        blk[j] = j < cnt ? j : cnt - 1;
    const __m512i dm = _mm512_permutexvar_epi16( /* the d halves, then the m halves (Q4_1, Q5_1) */
        _mm512_setr_epi32(0x00020000, 0x00060004, 0x000A0008, 0x000E000C, 0x00120010, 0x00160014, 0x001A0018, 0x001E001C,
                          0x00030001, 0x00070005, 0x000B0009, 0x000F000D, 0x00130011, 0x00170015, 0x001B0019, 0x001F001D),
        words);
    const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
    const __m512 mw = t <= T_Q5_1 ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1)) : _mm512_setzero_ps();
    __m512i lo[4], hi[4];
    for (int j = 0; j < 4; j++) {
        const __m512i n = ISA(rows16)(w, blk[j] * wbytes, W_QS(t));
        lo[j] = _mm512_and_si512(n, m4), hi[j] = _mm512_and_si512(_mm512_srli_epi16(n, 4), m4);
        if (t == T_IQ4_NL) {
            const __m512i grid = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kvalues_iq4nl)),
                                                  _mm512_set1_epi8((char)0x80));
            lo[j] = _mm512_shuffle_epi8(grid, lo[j]), hi[j] = _mm512_shuffle_epi8(grid, hi[j]);
        } else if (t != T_Q4_1) { /* + 16 where the fifth bit is set: lane r's qh words are row r's */
            const char c = (char)(4 * j);
            const __m512i bit = _mm512_set1_epi64((long long)0x8040201008040201ull);
            const __m512i at = _mm512_broadcast_i32x4(_mm_setr_epi8(c, c, c, c, c, c, c, c, c + 1, c + 1, c + 1, c + 1,
                                                                    c + 1, c + 1, c + 1, c + 1));
            const __mmask64 klo = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, at), bit);
            const __mmask64 khi = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, _mm512_add_epi8(at, _mm512_set1_epi8(2))), bit);
            lo[j] = _mm512_mask_add_epi8(lo[j], klo, lo[j], _mm512_set1_epi8(16));
            hi[j] = _mm512_mask_add_epi8(hi[j], khi, hi[j], _mm512_set1_epi8(16));
        }
    }
    for (int n = 0; n < N; n++) {
        __m512i z[4];
        for (int j = 0; j < 4; j++) {
            const char *xb = x[n] + blk[j] * xbytes + X_QS(t);
            const __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xb));
            const __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb + 16)));
            z[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[j], xlo), hi[j], xhi);
        }
        const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
        const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
        __m512i isum = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
        /* x's d (and s, or the sum of its quants) of the 4 blocks, in lanes j of every 128-bit lane */
        const __m128i xw = _mm_setr_epi32(ISA(load32)(x[n] + blk[0] * xbytes), ISA(load32)(x[n] + blk[1] * xbytes),
                                          ISA(load32)(x[n] + blk[2] * xbytes), ISA(load32)(x[n] + blk[3] * xbytes));
        if (t == T_Q5_0 || t == T_IQ4_NL) /* the weights' offset (16, 128) times x's sum, taken back */
            isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(_mm512_broadcast_i32x4(_mm_srai_epi32(xw, 16)),
                                                            t == T_Q5_0 ? 4 : 7));
        const __m512 sums = _mm512_cvtepi32_ps(isum);
        const __m256 xf = _mm256_cvtph_ps(_mm_shuffle_epi8(xw, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)));
        const __m512 dx = _mm512_broadcast_f32x4(_mm256_castps256_ps128(xf));
        __m512 term = ISA(fixed16)(_mm512_mul_ps(_mm512_mul_ps(dw, dx), sums));
        if (t <= T_Q5_1) /* + m_w s_x, rounded on its own, then the block's two terms summed */
            term = _mm512_add_ps(term, ISA(fixed16)(_mm512_mul_ps(mw, _mm512_broadcast_f32x4(_mm256_extractf128_ps(xf, 1)))));
        term = ISA(fixed16)(term);
        acc[n] = _mm512_add_ps(acc[n], term);
        if (cnt > 1)
            acc[n] = _mm512_add_ps(acc[n], _mm512_permute_ps(term, _MM_SHUFFLE(1, 1, 1, 1)));
        if (cnt > 2)
            acc[n] = _mm512_add_ps(acc[n], _mm512_permute_ps(term, _MM_SHUFFLE(2, 2, 2, 2)));
        if (cnt > 3)
            acc[n] = _mm512_add_ps(acc[n], _mm512_permute_ps(term, _MM_SHUFFLE(3, 3, 3, 3)));
    }
}

TARGET TD_INLINE void ISA(tile32)(const int t, const int N, int64_t k, const char *vw, int64_t row_bytes,
                                  const char *vx, int64_t x_bytes, float *y, int64_t ldy)
{
    const char *w[4] = {vw, vw + row_bytes, vw + 2 * row_bytes, vw + 3 * row_bytes}, *x[4];
    const int64_t nb = k / QK8_0;
    const __m512i grow = _mm512_mullo_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                            _mm512_set1_epi32((int)row_bytes)); /* lane 4r: row r's offset */
    const __m512i jv = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    const __m512i wb = _mm512_set1_epi32((int)W_BYTES(t));
    __m512 acc[4];
    for (int n = 0; n < N; n++)
        x[n] = vx + n * x_bytes, acc[n] = _mm512_setzero_ps();
    int64_t i = 0;
    const __m512i gidx = _mm512_add_epi32(grow, _mm512_mullo_epi32(jv, wb));
    __m512i words = _mm512_setzero_si512(), qh = _mm512_setzero_si512();
    if (nb >= 4)
        ISA(gather32)(t, w[0], gidx, &words, &qh);
    const int ahead = !td_amd;
    for (; i + 4 <= nb; i += 4) { /* the next step's scales gathered before this step's work */
        __m512i next = _mm512_setzero_si512(), next_qh = _mm512_setzero_si512();
        if (i + 8 <= nb)
            ISA(gather32)(t, w[0] + 4 * W_BYTES(t), gidx, &next, &next_qh);
        for (int r = 0; ahead && r < 4; r++) /* two lines each: a step reads 72-96 bytes of a row */
            for (int l = 0; l < 128; l += 64)
                __builtin_prefetch(w[r] + AHEAD_L1 + l), __builtin_prefetch(w[r] + AHEAD_L2 + l, 0, 1);
        ISA(step32)(t, N, 4, w, words, qh, x, acc);
        for (int r = 0; r < 4; r++)
            w[r] += 4 * W_BYTES(t);
        for (int n = 0; n < N; n++)
            x[n] += 4 * X_BYTES(t);
        words = next, qh = next_qh;
    }
    const int tail = (int)(nb - i); /* the blocks past the last 4 read the last */
    if (tail) {
        const __m512i gtail = _mm512_add_epi32(grow, _mm512_mullo_epi32(_mm512_min_epi32(jv, _mm512_set1_epi32(tail - 1)), wb));
        ISA(gather32)(t, w[0], gtail, &words, &qh);
    }
    switch (tail) {
    case 1: ISA(step32)(t, N, 1, w, words, qh, x, acc); break;
    case 2: ISA(step32)(t, N, 2, w, words, qh, x, acc); break;
    case 3: ISA(step32)(t, N, 3, w, words, qh, x, acc); break;
    }
    for (int n = 0; n < N; n++) { /* lane 4r: row r */
        float a[16];
        _mm512_storeu_ps(a, acc[n]);
        for (int r = 0; r < 4; r++)
            y[n * ldy + r] = a[4 * r];
    }
}
#endif

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
#undef AHEAD_L1
#undef AHEAD_L2
