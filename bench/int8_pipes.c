/* int8_pipes.c: how many of the AVX2 instructions an exact int8 dot product needs (sign, maddubs,
   madd) this core issues a cycle, alone and mixed, and its clock: the ceiling of the Q8_0X8
   kernel without VNNI (README, "What batching buys"). And the other exact way, int16: weights
   widened (vpmovsxbw) and multiplied by madd alone (16 products an instruction, against 32 for
   sign + maddubs + madd), its sums added by vpaddd: madd_add and pmovsx say what that would reach.

       cc -O2 -mavx2 -o /tmp/int8_pipes bench/int8_pipes.c && /tmp/int8_pipes

   Eight independent chains of one instruction (or two alternating) per loop: a chain's latency
   never binds, so instructions a cycle is what the pipes that take them can issue; vpaddd, which
   more pipes take, shows that the loop itself does not cap the count. The clock comes
   from a chain of dependent scalar adds (one a cycle on every x86 core since the Pentium Pro). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define N 50000000L

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double ghz(void)
{
    long n = 1000000000L, x = 0;
    double t = now();
    __asm__ volatile("1: add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0\n sub $4, %1\n jnz 1b"
                     : "+r"(x), "+r"(n));
    return 1.0 / (now() - t);
}

#define MADDUBS(a, j) a = _mm256_maddubs_epi16(a, b);
#define MADD(a, j) a = _mm256_madd_epi16(a, one);
#define SIGN(a, j) a = _mm256_sign_epi8(a, b);
#define ADD(a, j) a = _mm256_add_epi32(a, b);
#define MADDUBS_MADD(a, j) if (j & 1) { MADDUBS(a, j) } else { MADD(a, j) }
#define MADDUBS_SIGN(a, j) if (j & 1) { MADDUBS(a, j) } else { SIGN(a, j) }
#define MADD_SIGN(a, j) if (j & 1) { MADD(a, j) } else { SIGN(a, j) }
#define PMOVSX(a, j) a = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a));
/* the int16 kernel's step for one x row: products of fixed inputs (volatile: made every time, as
   the kernel's from fresh loads, so never on a chain), added into the row's sums; chain 7 also
   widens the next weights (one vpmovsxbw serves the 8 x rows) */
#define MADD_ADD(a, j)                                                                             \
    {                                                                                              \
        __m256i t;                                                                                 \
        __asm__ volatile("vpmaddwd %2, %1, %0" : "=x"(t) : "x"(b), "x"(one));                      \
        a = _mm256_add_epi32(a, t);                                                                \
    }
#define INT16_STEP(a, j)                                                                           \
    MADD_ADD(a, j)                                                                                 \
    if (j == 7)                                                                                    \
        __asm__ volatile("vpmovsxbw %1, %0" : "=x"(w) : "x"(_mm256_castsi256_si128(b)));

/* instructions a cycle of OP on eight chains (`per` instructions each), at `clock` GHz */
#define PROBE(name, OP) PROBE_N(name, OP, 1)
#define PROBE_N(name, OP, per)                                                                                \
    static void name(double clock)                                                                            \
    {                                                                                                         \
        __m256i w;                                                                                            \
        (void)w;                                                                                              \
        __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3),                 \
                a3 = _mm256_set1_epi8(4), a4 = _mm256_set1_epi8(5), a5 = _mm256_set1_epi8(6),                 \
                a6 = _mm256_set1_epi8(7), a7 = _mm256_set1_epi8(8);                                           \
        const __m256i b = _mm256_set1_epi8(3), one = _mm256_set1_epi16(1);                                    \
        (void)b, (void)one;                                                                                   \
        double t = now();                                                                                     \
        for (long i = 0; i < N; i++) {                                                                        \
            OP(a0, 0) OP(a1, 1) OP(a2, 2) OP(a3, 3) OP(a4, 4) OP(a5, 5) OP(a6, 6) OP(a7, 7)                   \
            __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),       \
                             "+x"(a7));                                                                       \
        }                                                                                                     \
        t = now() - t;                                                                                        \
        printf("%-13s %.2f a cycle\n", #name, (per) * 8.0 * N / (t * clock * 1e9));                           \
    }
PROBE(maddubs, MADDUBS)
PROBE(madd, MADD)
PROBE(sign, SIGN)
PROBE(maddubs_madd, MADDUBS_MADD)
PROBE(maddubs_sign, MADDUBS_SIGN)
PROBE(madd_sign, MADD_SIGN)
PROBE(add, ADD)
PROBE_N(madd_add, MADD_ADD, 2)
PROBE(pmovsx, PMOVSX)
PROBE_N(int16_step, INT16_STEP, 2.125)

int main(void)
{
    const double clock = ghz();
    printf("clock %.2f GHz\n", clock);
    maddubs(clock), madd(clock), sign(clock);
    maddubs_madd(clock), maddubs_sign(clock), madd_sign(clock);
    add(clock);
    madd_add(clock), pmovsx(clock), int16_step(clock);
    return 0;
}
