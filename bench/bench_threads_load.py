"""A pool of 2 threads on a busy machine, against 1 thread: the worst case, both threads on one core.

    python bench/bench_threads_load.py [--calls 1000]

Every thread of the process (the pools' workers included) is pinned to one core, so a worker runs
only when the scheduler gives it a turn. It prints the best time of a 768x768 matvec on a 1-thread
and a 2-thread pool, and their ratio. A pool that waited for its worker's part ran 7-8x slower on 2
threads than on 1 here; csrc/threads.c's caller runs the parts no worker has claimed, which brings
it to about 1x. (A speed, so measured here, never asserted by a test.)
"""
import argparse
import os
import time

import numpy as np

from tinydiff.engine import kernels as K


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 768), dtype=np.float32)
    w = rng.standard_normal((768, 768), dtype=np.float32)
    pools = {n: K.ThreadPool(n) for n in (1, 2)}
    cpu = min(os.sched_getaffinity(0))
    for tid in os.listdir("/proc/self/task"):      # every thread, the pools' workers included
        os.sched_setaffinity(int(tid), {cpu})
    best = {}
    for _ in range(3):
        for n, pool in pools.items():
            with pool:
                start = time.perf_counter()
                for _ in range(args.calls):
                    K.matmul(x, w)
                best[n] = min(best.get(n, 1e9), (time.perf_counter() - start) / args.calls)
    print(f"one core: 1 thread {best[1] * 1e6:.1f} us/call, 2 threads {best[2] * 1e6:.1f} us/call, "
          f"ratio {best[2] / best[1]:.2f}")


if __name__ == "__main__":
    main()
