"""Threads belong to a model: each Model has a thread pool of its own (csrc/threads.c), so two
models run at the same time from two Python threads, each on its own thread count."""
import gc
import os
import threading
import time

import numpy as np
import pytest

import tinydiff
from tinydiff.engine import kernels as K
from tinydiff.errors import UsageError
from tinydiff.measure.shapes import random_model
from tinydiff.model import default_model_path

MODEL = os.path.join(os.path.dirname(__file__), "fixtures", "hf", "llama-gqa")
PROMPT = list(range(1, 17))
two_cores = pytest.mark.skipif(K.physical_cores() < 2, reason="needs 2 physical cores")


def greedy(model, n=24):
    return model.generate_ids(PROMPT, n, temperature=0)


def run_at_once(*calls):
    """The results of calls, each run in a Python thread of its own, all started together."""
    results = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def work(i):
        start.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@two_cores
def test_two_models_generate_at_once_each_on_its_own_threads():
    """A on 1 thread and B on 2, generating together: each gives its single-threaded ids, A's jobs
    never used more than 1 thread while B's used 2, and the two pools ran jobs at the same moment
    (impossible if they shared one job mutex, as the process-wide pool did)."""
    a, b = random_model("stories15M", seed=1), random_model("stories15M", seed=2)
    a.pool.threads = b.pool.threads = 1
    want = [greedy(a), greedy(b)]
    b.pool.threads = 2
    for _ in range(20):                # overlap is likely, not certain, on a busy machine
        for reset in (a.pool._max_parts, b.pool._max_parts, K._max_busy_pools):
            reset(reset=True)
        assert run_at_once(lambda: greedy(a), lambda: greedy(b)) == want
        assert (a.pool._max_parts(), b.pool._max_parts()) == (1, 2)
        if K._max_busy_pools() >= 2:
            break
    assert K._max_busy_pools() >= 2, "the two models' jobs never ran at the same time"


def test_a_models_threads_are_its_own(threads):
    a, b = tinydiff.load(MODEL, threads=1), tinydiff.load(MODEL, threads=K.physical_cores())
    assert (a.pool.threads, b.pool.threads) == (1, K.physical_cores())
    a.pool.threads = 2
    tinydiff.set_threads(1)
    assert (a.pool.threads, b.pool.threads, K.get_threads()) == (2, K.physical_cores(), 1)
    # a model made without a count of its own gets the default pool's
    assert random_model("stories15M").pool.threads == tinydiff.load(MODEL).pool.threads == 1


@pytest.mark.parametrize("bad", [0, 1.5, 10**6])
def test_bad_thread_counts_are_usage_errors(bad):
    for make in (lambda: tinydiff.load(MODEL, threads=bad), lambda: tinydiff.set_threads(bad),
                 lambda: setattr(K.ThreadPool(1), "threads", bad)):
        with pytest.raises(UsageError, match="threads") as e:
            make()
        assert "\n" not in str(e.value) and repr(bad) in str(e.value)


def test_bad_environment_is_reported_at_load(monkeypatch):
    monkeypatch.setenv("TINYDIFF_THREADS", "0")
    with pytest.raises(UsageError, match="TINYDIFF_THREADS.*got 0"):
        tinydiff.load(MODEL)
    monkeypatch.setenv("TINYDIFF_THREADS", "1")
    assert K.threads_from_env() == 1


def test_with_sets_the_calling_threads_pool_and_restores_the_last(threads):
    one, two = K.ThreadPool(1), K.ThreadPool(2)
    K.set_threads(3)
    seen = []
    with one:
        seen.append(K.get_threads())
        with two:
            seen.append(K.get_threads())
            with one:
                seen.append(K.get_threads())
                seen.append(run_at_once(K.get_threads)[0])   # another Python thread: the default pool
            seen.append(K.get_threads())
        with pytest.raises(ZeroDivisionError), two:
            1 / 0
        seen.append(K.get_threads())
    seen.append(K.get_threads())
    assert seen == [1, 2, 1, 3, 2, 1, 3]


def task_count():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def settled_task_count():
    """The thread count once the pools of earlier tests' garbage are freed (their workers joined)."""
    gc.collect()
    count, deadline = task_count(), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if task_count() == count:
            return count
        count = task_count()
    return count


def test_idle_pools_are_freed_with_their_workers():
    before = settled_task_count()
    pools = [K.ThreadPool(3), K.ThreadPool(2)]
    x = np.ones((64, 512), np.float32)
    for pool in pools:
        with pool:
            K.matmul(x, x)                 # big enough to wake every worker
    assert task_count() == before + 3
    del pools, pool
    gc.collect()
    deadline = time.monotonic() + 5        # a joined thread may stay listed for a moment as it exits
    while task_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert task_count() == before


def wait_for_child(pid, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("forked child hung")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_another_pool_is_busy():
    """Every pool's job mutex is held across fork: a child forked while another Python thread runs
    jobs on a model's pool can use that pool (it would wait forever on a mutex its parent held)."""
    model = random_model("stories15M", seed=3)
    model.pool.threads = 2
    want = greedy(model, 4)
    stop = threading.Event()

    def keep_busy():
        while not stop.is_set():
            greedy(model, 4)

    busy = threading.Thread(target=keep_busy)
    busy.start()
    try:
        for _ in range(5):
            time.sleep(0.02)
            pid = os.fork()
            if pid == 0:
                os._exit(0 if greedy(model, 4) == want else 1)
            assert wait_for_child(pid) == 0
    finally:
        stop.set()
        busy.join()


@two_cores
def test_a_denoisers_sampler_runs_on_the_models_pool():
    """The diffusion sampler's kernels (softmax_stats over every masked row, gumbel_max) run on the
    model's pool, as its passes do: none reaches the default pool, whose worker would otherwise be
    woken once a step (three threads on two cores). One run and a batch of two."""
    mdm = tinydiff.load(default_model_path("diffusion"), threads=2)
    want = mdm.denoise_ids([1, 2, 3], 32, steps=8, temperature=0.7, seed=3)
    old = K.get_threads()
    tinydiff.set_threads(2)
    try:
        for together in (False, True):
            K._default_pool_max_parts(reset=True), mdm.pool._max_parts(reset=True)
            got = mdm.denoise_ids([[1, 2, 3]] * 2 if together else [1, 2, 3], 32, steps=8, temperature=0.7, seed=3)
            assert got == ([got[0]] * 2 if together else want) and len(got[0] if together else got) == 32
            assert (K._default_pool_max_parts(), mdm.pool._max_parts()) == (0, 2)
    finally:
        tinydiff.set_threads(old)
