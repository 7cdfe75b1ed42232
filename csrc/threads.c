/* threads.c: a persistent pthread pool. After a job, workers watch for the next one for up to
   TD_SPIN_US, then sleep on a condition variable (no spinning while idle). The watch is what makes
   two threads pay off on small matrices: waking a sleeping thread costs ~50-70 us on a VM, more
   than a 256x256 matvec, while the next kernel of a forward pass comes a few us after the last.
   The caller likewise watches for the workers to finish before it sleeps. A job is fn over [0, ntasks) cut into one contiguous range per thread;
   the calling thread runs range 0 itself. The job mutex lets one job run at a time, so kernels
   called from several Python threads at once (cffi drops the GIL) simply queue up. A kernel that
   needs several jobs in a row, or scratch memory between them, holds the pool across them
   (td_pool_enter / td_pool_leave). */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include "internal.h"

#define TD_MAX_THREADS 1024
#define TD_MIN_COST_PER_THREAD 65536.0 /* float ops (some us of work) worth handing to a watching worker */
#define TD_SPIN_US 200                 /* how long a worker (or the caller) watches before sleeping */

static struct {
    pthread_mutex_t job;   /* held for a whole job or resize */
    pthread_mutex_t lock;  /* guards every field below */
    pthread_cond_t start;  /* workers wait here for generation to change */
    pthread_cond_t finish; /* the caller waits here for busy == 0 */
    pthread_t *workers;    /* [nworkers] running threads; part i+1 belongs to workers[i] */
    int nworkers;
    int nthreads;          /* wanted: workers + the caller */
    unsigned generation;   /* bumped for each job, and to stop the workers */
    unsigned spawned_at;   /* generation when the current workers were created */
    int stop;
    unsigned busy;         /* workers still running their part of the job */
    td_range_fn fn;        /* the job: fn(ctx, ...) over [0, ntasks) in nparts ranges */
    void *ctx;
    int64_t ntasks;
    int nparts;
    void *scratch;         /* [scratch_bytes] grow-only, for whoever holds the job mutex */
    int64_t scratch_bytes;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, NULL, 0, 1, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL, 0};

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

/* Watches *x (read without the lock) for up to TD_SPIN_US until (*x == value) == equal; 1 if it came */
static int watch_for(const unsigned *x, unsigned value, int equal)
{
    int64_t until = now_us() + TD_SPIN_US;
    for (int i = 1;; i++) {
        if ((__atomic_load_n(x, __ATOMIC_ACQUIRE) == value) == equal)
            return 1;
        cpu_relax();
        if (i % 256 == 0 && now_us() > until)
            return 0;
    }
}

static void *worker_main(void *arg)
{
    int part = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    unsigned seen = pool.spawned_at;
    for (;;) {
        if (pool.generation == seen) {
            pthread_mutex_unlock(&pool.lock);
            watch_for(&pool.generation, seen, 0);
            pthread_mutex_lock(&pool.lock);
        }
        while (pool.generation == seen)
            pthread_cond_wait(&pool.start, &pool.lock);
        seen = pool.generation;
        if (pool.stop)
            break;
        if (part >= pool.nparts)
            continue;
        td_range_fn fn = pool.fn;
        void *ctx = pool.ctx;
        int64_t ntasks = pool.ntasks;
        int nparts = pool.nparts;
        pthread_mutex_unlock(&pool.lock);
        run_part(fn, ctx, ntasks, nparts, part);
        pthread_mutex_lock(&pool.lock);
        if (__atomic_sub_fetch(&pool.busy, 1, __ATOMIC_RELEASE) == 0)
            pthread_cond_signal(&pool.finish);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

/* with pool.job held: join all workers */
static void stop_workers(void)
{
    pthread_mutex_lock(&pool.lock);
    pool.stop = 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < pool.nworkers; i++)
        pthread_join(pool.workers[i], NULL);
    free(pool.workers);
    pool.workers = NULL;
    pool.nworkers = 0;
    pool.stop = 0;
}

/* with pool.job held: have nthreads - 1 workers (fewer if the system refuses to make more) */
static void ensure_workers(void)
{
    int want = pool.nthreads - 1;
    if (pool.nworkers == want)
        return;
    stop_workers();
    pool.workers = malloc(sizeof(pthread_t) * (want > 0 ? want : 1));
    if (!pool.workers)
        return;
    pool.spawned_at = pool.generation;
    while (pool.nworkers < want &&
           pthread_create(&pool.workers[pool.nworkers], NULL, worker_main,
                          (void *)(intptr_t)(pool.nworkers + 1)) == 0)
        pool.nworkers++;
}

/* fork: hold the job mutex across it so no job is half-run; the child has no workers and
   makes new ones on its next job */
static void before_fork(void) { pthread_mutex_lock(&pool.job); }
static void after_fork_parent(void) { pthread_mutex_unlock(&pool.job); }
static void after_fork_child(void)
{
    pthread_mutex_init(&pool.job, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.start, NULL);
    pthread_cond_init(&pool.finish, NULL);
    free(pool.workers);
    pool.workers = NULL;
    pool.nworkers = 0;
    pool.stop = 0;
}

__attribute__((constructor)) static void td_pool_init(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

int td_set_threads(int n)
{
    n = n < 1 ? 1 : n > TD_MAX_THREADS ? TD_MAX_THREADS : n;
    pthread_mutex_lock(&pool.job);
    pool.nthreads = n;
    ensure_workers();
    n = pool.nworkers + 1;
    pthread_mutex_unlock(&pool.job);
    return n;
}

int td_get_threads(void)
{
    pthread_mutex_lock(&pool.job);
    int n = pool.nthreads;
    pthread_mutex_unlock(&pool.job);
    return n;
}

void td_pool_enter(void)
{
    pthread_mutex_lock(&pool.job);
    ensure_workers();
}

void td_pool_leave(void) { pthread_mutex_unlock(&pool.job); }

void *td_scratch(int64_t bytes)
{
    if (bytes > pool.scratch_bytes) {
        void *p = NULL;
        if (posix_memalign(&p, 64, (size_t)bytes))
            return NULL;
        free(pool.scratch);
        pool.scratch = p;
        pool.scratch_bytes = bytes;
    }
    return pool.scratch;
}

void td_parallel_run(td_range_fn fn, void *ctx, int64_t ntasks, double cost)
{
    if (ntasks <= 0)
        return;
    double by_cost = cost * (double)ntasks / TD_MIN_COST_PER_THREAD;
    int64_t nparts = pool.nworkers + 1;
    if (nparts > ntasks)
        nparts = ntasks;
    if (nparts > by_cost)
        nparts = by_cost < 1 ? 1 : (int64_t)by_cost;
    if (nparts > 1) {
        pthread_mutex_lock(&pool.lock);
        pool.fn = fn;
        pool.ctx = ctx;
        pool.ntasks = ntasks;
        pool.nparts = (int)nparts;
        pool.busy = (unsigned)nparts - 1;
        __atomic_add_fetch(&pool.generation, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&pool.start);
        pthread_mutex_unlock(&pool.lock);
    }
    run_part(fn, ctx, ntasks, (int)nparts, 0);
    if (nparts > 1) {
        watch_for(&pool.busy, 0, 1);
        pthread_mutex_lock(&pool.lock);
        while (pool.busy > 0)
            pthread_cond_wait(&pool.finish, &pool.lock);
        pthread_mutex_unlock(&pool.lock);
    }
}

void td_parallel_for(td_range_fn fn, void *ctx, int64_t ntasks, double cost)
{
    if (ntasks <= 0)
        return;
    td_pool_enter();
    td_parallel_run(fn, ctx, ntasks, cost);
    td_pool_leave();
}
