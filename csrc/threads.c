/* threads.c: persistent pthread pools, one per model (td_pool_new) plus the process default pool.

   A pool owns its workers, its job mutex, condition variables and scratch buffer, so models with
   pools of their own run kernels at the same time from several Python threads (cffi drops the GIL)
   and never change each other's thread count. The kernels take no pool argument: each kernel call
   runs on the calling thread's current pool, a thread-local pointer set by td_pool_use (NULL: the
   default pool, which td_set_threads sizes for code that never makes a pool).

   A job is fn over [0, ntasks) cut into nparts contiguous ranges (at most one per thread). The parts
   are claimed, not assigned: the calling thread runs part 0, then claims and runs every part no
   worker has claimed yet, and waits only for parts a worker is running. So a worker that is not on
   a core when the job comes (the cores busy with other processes) costs nothing: the caller does
   its share. The ranges do not depend on who runs them, so results are the same bit for bit.

   After a job, a worker watches for the next one for up to TD_SPIN_US, then sleeps on a condition
   variable (no spinning while idle). The watch is what makes two threads pay off on small
   matrices: waking a sleeping thread costs ~50-70 us on a VM, more than a 256x256 matvec, while the
   next kernel of a forward pass comes a few us after the last. But a worker that came too late to
   claim a part of the last job it saw halves its watch for each such miss in a row, down to
   TD_SPIN_US / 16: the cores are busy, the caller does the work without it, and a long watch would
   only take a core from the caller. The short watch still lets it catch a job in time once the
   cores are free again, which gives it back the whole watch (never watching after a miss, a worker
   woken ~60 us late for each small job would stay late after the load is gone). The caller watches
   for running parts to finish before it sleeps. Both watches yield the core (sched_yield) now and
   then, to a thread of another process that is waiting for it.

   A pool's job mutex lets one job run at a time on it, so kernels called on one pool from several
   Python threads at once simply queue up. A kernel that needs several jobs in a row, or scratch
   memory between them, holds the pool across them (td_pool_enter / td_pool_leave).

   fork: every pool is on one list; each pool's job mutex is held across fork, so no job is
   half-run, and the child's pools have no workers: they make new ones on their next job.

   For tests, a pool keeps the most parts one of its jobs was cut into, and all pools together the
   most of them inside a job at the same moment (td_pool_max_parts, td_max_busy_pools): that two
   models' jobs overlap is what a job mutex per pool is for. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include "internal.h"

#define TD_MIN_COST_PER_THREAD 65536.0 /* float ops (some us of work) worth handing to a watching worker */
#define TD_SPIN_US 200                 /* how long a worker (or the caller) watches before sleeping */
#define TD_MAX_MISSES 4                /* a late worker's watch: TD_SPIN_US >> misses in a row, at most this */

struct td_worker {
    pthread_t thread;
    struct td_pool *pool;
};

struct td_pool {
    pthread_mutex_t job;   /* held for a whole job or resize */
    pthread_mutex_t lock;  /* guards generation, stop, done and the job (fn .. nparts) */
    pthread_cond_t start;  /* workers wait here for generation to change */
    pthread_cond_t finish; /* the caller waits here for done == nparts */
    struct td_worker *workers; /* [nworkers] running threads */
    int nworkers;
    int nthreads;          /* wanted: workers + the caller (written under job, read atomically) */
    unsigned generation;   /* bumped for each job, and to stop the workers */
    unsigned spawned_at;   /* generation when the current workers were created */
    int stop;
    uint64_t claim;        /* generation << 32 | the next part to claim (atomic compare-and-swap) */
    unsigned done;         /* parts of the job finished */
    td_range_fn fn;        /* the job: fn(ctx, ...) over [0, ntasks) in nparts ranges */
    void *ctx;
    int64_t ntasks;
    int nparts;
    void *scratch;         /* [scratch_bytes] grow-only, for whoever holds the job mutex */
    int64_t scratch_bytes;
    int max_parts;         /* the most parts a job was cut into since the last reset (job mutex) */
    struct td_pool *next;  /* the list of every pool, for fork (pools_lock) */
};

static struct td_pool default_pool = {
    .job = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .start = PTHREAD_COND_INITIALIZER,
    .finish = PTHREAD_COND_INITIALIZER,
    .nthreads = 1,
};
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the list from default_pool */
static __thread struct td_pool *current;                      /* this thread's pool; NULL: default */
static unsigned busy_pools, max_busy_pools; /* pools inside a job now, and at most since a reset */

static struct td_pool *pool_in_use(void) { return current ? current : &default_pool; }

static void run_part(td_range_fn fn, void *ctx, int64_t ntasks, int nparts, int part)
{
    int64_t begin = ntasks * part / nparts, end = ntasks * (part + 1) / nparts;
    if (begin < end)
        fn(ctx, begin, end);
}

static int64_t now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Watches *x (read without the lock) for up to us microseconds until (*x == value) == equal; 1 if it
   came. Every 256 pauses (some us) it yields: free when no other thread waits for this core. */
static int watch_for(const unsigned *x, unsigned value, int equal, int us)
{
    int64_t until = now_us() + us;
    for (int i = 1;; i++) {
        if ((__atomic_load_n(x, __ATOMIC_ACQUIRE) == value) == equal)
            return 1;
        cpu_relax();
        if (i % 256 == 0) {
            if (now_us() > until)
                return 0;
            sched_yield();
        }
    }
}

/* the next unclaimed part of job generation gen (nparts parts), now this thread's; -1: none left */
static int claim_part(struct td_pool *p, unsigned gen, int nparts)
{
    uint64_t c = __atomic_load_n(&p->claim, __ATOMIC_ACQUIRE);
    for (;;) {
        if ((unsigned)(c >> 32) != gen || (int)(uint32_t)c >= nparts)
            return -1;
        if (__atomic_compare_exchange_n(&p->claim, &c, c + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return (int)(uint32_t)c;
    }
}

static void *worker_main(void *arg)
{
    struct td_worker *w = arg;
    struct td_pool *p = w->pool;
    int misses = 0; /* jobs in a row it woke for after the caller and workers had claimed every part */
    pthread_mutex_lock(&p->lock);
    unsigned seen = p->spawned_at;
    for (;;) {
        if (p->generation == seen) {
            pthread_mutex_unlock(&p->lock);
            watch_for(&p->generation, seen, 0, TD_SPIN_US >> misses);
            pthread_mutex_lock(&p->lock);
        }
        while (p->generation == seen)
            pthread_cond_wait(&p->start, &p->lock);
        seen = p->generation;
        if (p->stop)
            break;
        td_range_fn fn = p->fn;
        void *ctx = p->ctx;
        int64_t ntasks = p->ntasks;
        int nparts = p->nparts;
        pthread_mutex_unlock(&p->lock);
        unsigned ran = 0;
        for (int part; (part = claim_part(p, seen, nparts)) >= 0; ran++)
            run_part(fn, ctx, ntasks, nparts, part);
        misses = ran ? 0 : misses < TD_MAX_MISSES ? misses + 1 : misses;
        pthread_mutex_lock(&p->lock);
        if (ran && __atomic_add_fetch(&p->done, ran, __ATOMIC_RELEASE) == (unsigned)nparts)
            pthread_cond_signal(&p->finish);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* with p->job held: join all workers */
static void stop_workers(struct td_pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nworkers; i++)
        pthread_join(p->workers[i].thread, NULL);
    free(p->workers);
    p->workers = NULL;
    p->nworkers = 0;
    p->stop = 0;
}

/* with p->job held: have nthreads - 1 workers (fewer if the system refuses to make more).
   -1 if there is no memory to keep track of them (the pool then runs on the caller alone). */
static int ensure_workers(struct td_pool *p)
{
    int want = p->nthreads - 1;
    if (p->nworkers == want)
        return 0;
    stop_workers(p);
    p->workers = malloc(sizeof(struct td_worker) * (want > 0 ? want : 1));
    if (!p->workers)
        return -1;
    p->spawned_at = p->generation;
    for (; p->nworkers < want; p->nworkers++) {
        struct td_worker *w = &p->workers[p->nworkers];
        *w = (struct td_worker){.pool = p};
        if (pthread_create(&w->thread, NULL, worker_main, w))
            break;
    }
    return 0;
}

static int clamp_threads(int n) { return n < 1 ? 1 : n > TD_MAX_THREADS ? TD_MAX_THREADS : n; }

/* 0, or nonzero if a mutex or condition variable could not be made (not on Linux: no attributes) */
static int init_sync(struct td_pool *p)
{
    return pthread_mutex_init(&p->job, NULL) | pthread_mutex_init(&p->lock, NULL) |
           pthread_cond_init(&p->start, NULL) | pthread_cond_init(&p->finish, NULL);
}

/* fork: hold every pool's job mutex across it so no job is half-run; the child's pools have no
   workers and make new ones on their next job */
static void before_fork(void)
{
    pthread_mutex_lock(&pools_lock);
    for (struct td_pool *p = &default_pool; p; p = p->next)
        pthread_mutex_lock(&p->job);
}

static void after_fork_parent(void)
{
    for (struct td_pool *p = &default_pool; p; p = p->next)
        pthread_mutex_unlock(&p->job);
    pthread_mutex_unlock(&pools_lock);
}

static void after_fork_child(void)
{
    pthread_mutex_init(&pools_lock, NULL);
    for (struct td_pool *p = &default_pool; p; p = p->next) {
        init_sync(p);
        free(p->workers);
        p->workers = NULL;
        p->nworkers = 0;
        p->stop = 0;
    }
}

__attribute__((constructor)) static void td_pool_init(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

struct td_pool *td_pool_new(int nthreads)
{
    struct td_pool *p = malloc(sizeof *p);
    if (!p)
        return NULL;
    *p = (struct td_pool){.nthreads = clamp_threads(nthreads)};
    if (init_sync(p) || ensure_workers(p)) {
        free(p);
        return NULL;
    }
    pthread_mutex_lock(&pools_lock);
    p->next = default_pool.next;
    default_pool.next = p;
    pthread_mutex_unlock(&pools_lock);
    return p;
}

void td_pool_free(struct td_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&pools_lock);
    struct td_pool **at = &default_pool.next;
    while (*at != p)
        at = &(*at)->next;
    *at = p->next;
    pthread_mutex_unlock(&pools_lock);
    pthread_mutex_lock(&p->job);
    stop_workers(p);
    pthread_mutex_unlock(&p->job);
    pthread_mutex_destroy(&p->job);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->finish);
    free(p->scratch);
    free(p);
}

struct td_pool *td_pool_use(struct td_pool *p)
{
    struct td_pool *was = current;
    current = p;
    return was;
}

int td_pool_set_threads(struct td_pool *p, int n)
{
    p = p ? p : &default_pool;
    pthread_mutex_lock(&p->job);
    __atomic_store_n(&p->nthreads, clamp_threads(n), __ATOMIC_RELAXED);
    ensure_workers(p);
    n = p->nworkers + 1;
    pthread_mutex_unlock(&p->job);
    return n;
}

/* read without the job mutex: a kernel sizing its tasks needs no more than a recent value */
int td_pool_threads(const struct td_pool *p)
{
    return __atomic_load_n(&(p ? p : &default_pool)->nthreads, __ATOMIC_RELAXED);
}

int td_set_threads(int n) { return td_pool_set_threads(pool_in_use(), n); }

int td_get_threads(void) { return td_pool_threads(pool_in_use()); }

int td_pool_max_parts(struct td_pool *p, int reset)
{
    p = p ? p : &default_pool;
    pthread_mutex_lock(&p->job);
    int n = p->max_parts;
    if (reset)
        p->max_parts = 0;
    pthread_mutex_unlock(&p->job);
    return n;
}

int td_max_busy_pools(int reset)
{
    unsigned n = __atomic_load_n(&max_busy_pools, __ATOMIC_RELAXED);
    if (reset)
        __atomic_store_n(&max_busy_pools, __atomic_load_n(&busy_pools, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    return (int)n;
}

/* counts the pools inside a job, keeping the most seen at once */
static void note_busy(int delta)
{
    unsigned now = __atomic_add_fetch(&busy_pools, (unsigned)delta, __ATOMIC_RELAXED);
    unsigned most = __atomic_load_n(&max_busy_pools, __ATOMIC_RELAXED);
    while (now > most && !__atomic_compare_exchange_n(&max_busy_pools, &most, now, 1, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED))
        ;
}

void td_pool_enter(void)
{
    struct td_pool *p = pool_in_use();
    pthread_mutex_lock(&p->job);
    ensure_workers(p);
    note_busy(1);
}

void td_pool_leave(void)
{
    note_busy(-1);
    pthread_mutex_unlock(&pool_in_use()->job);
}

void *td_scratch(int64_t bytes)
{
    struct td_pool *p = pool_in_use();
    if (bytes > p->scratch_bytes) {
        void *mem = NULL;
        if (posix_memalign(&mem, 64, (size_t)bytes))
            return NULL;
        free(p->scratch);
        p->scratch = mem;
        p->scratch_bytes = bytes;
    }
    return p->scratch;
}

void td_parallel_run(td_range_fn fn, void *ctx, int64_t ntasks, double cost)
{
    if (ntasks <= 0)
        return;
    struct td_pool *p = pool_in_use();
    double by_cost = cost * (double)ntasks / TD_MIN_COST_PER_THREAD;
    int64_t nparts = p->nworkers + 1;
    if (nparts > ntasks)
        nparts = ntasks;
    if (nparts > by_cost)
        nparts = by_cost < 1 ? 1 : (int64_t)by_cost;
    if (nparts > p->max_parts)
        p->max_parts = (int)nparts;
    if (nparts == 1) {
        run_part(fn, ctx, ntasks, 1, 0);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    p->nparts = (int)nparts;
    p->done = 0;
    unsigned gen = p->generation + 1;
    __atomic_store_n(&p->claim, (uint64_t)gen << 32 | 1, __ATOMIC_RELEASE); /* part 0 is the caller's */
    __atomic_store_n(&p->generation, gen, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    unsigned ran = 1;
    run_part(fn, ctx, ntasks, (int)nparts, 0);
    for (int part; (part = claim_part(p, gen, (int)nparts)) >= 0; ran++)
        run_part(fn, ctx, ntasks, (int)nparts, part);
    if (__atomic_add_fetch(&p->done, ran, __ATOMIC_ACQ_REL) == (unsigned)nparts)
        return;
    watch_for(&p->done, (unsigned)nparts, 1, TD_SPIN_US);
    pthread_mutex_lock(&p->lock);
    while (__atomic_load_n(&p->done, __ATOMIC_ACQUIRE) != (unsigned)nparts)
        pthread_cond_wait(&p->finish, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

void td_parallel_for(td_range_fn fn, void *ctx, int64_t ntasks, double cost)
{
    if (ntasks <= 0)
        return;
    td_pool_enter();
    td_parallel_run(fn, ctx, ntasks, cost);
    td_pool_leave();
}
