/* roofline.c: the read loop behind the roofline's two bandwidths (tinydiff/measure/roofline.py times it).

   Each thread gets one contiguous slice of the array and reads it reps times, so a slice that fits
   a cache level is read from that level after the first pass, and an array far larger than the
   last-level cache is read from memory. The words read only feed an integer sum (exact, so a test
   can check every word was read), returned so the compiler cannot drop the reads. The kernel is in
   roofline_isa.h. */
#include "internal.h"

#define RD_BLOCK 4096 /* words per task (16 KiB): fine enough to split any array evenly */
#define ACC 8         /* vector accumulators */

struct rd {
    const uint32_t *x; /* [len] */
    int64_t len, reps;
    uint32_t sum; /* mod 2^32, the threads' sums added as each finishes */
};

#define TD_ISA_FILE "roofline_isa.h"
#include "foreach_isa.h"

uint32_t td_read_sum_u32(const uint32_t *x, int64_t len, int64_t reps)
{
    struct rd a = {.x = x, .len = len, .reps = reps};
    td_parallel_for(TD_PICK(read_sum), &a, (len + RD_BLOCK - 1) / RD_BLOCK, (double)RD_BLOCK * reps);
    return a.sum;
}
