/* Parts of one pass side by side on the library's own threads, kept waiting between calls.
 *
 * Python's thread pool hands a part to another thread and collects it in about 40 us, as long
 * as a pass over a megabyte takes; a wait on a condition variable wakes in about 10. So the
 * small elementwise passes (ReLU, Dropout) can use every core, where the pool would cost more
 * than the second core saves.
 *
 * One call at a time uses the threads: a call made while they are busy (from another Python
 * thread, or from inside a part) runs all its parts itself. A child of fork() has none of
 * them: it starts its own. They are kept off the caller's CPU (keep_off_caller).
 *
 * A pass is cut into pieces, PIECES_A_PART for each thread, which the caller and the workers
 * take in turn: a worker woken late (30 us, and 100 or more where its core was idle on a
 * virtual machine) finds the pieces it came for already taken by the caller, which never
 * waits for a part nobody has started. Each piece is the same pass over its range, whoever
 * takes it: the same values. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>

#include "parts.h"

#define MAX_PARTS 64
#define PIECES_A_PART 4

static struct {
    pthread_mutex_t call;        /* held by the call using the threads */
    pthread_mutex_t lock;        /* guards the fields below */
    pthread_cond_t start;        /* a new pass for the workers */
    pthread_cond_t finished;     /* the pass's last piece is done */
    int workers;                 /* threads started: parts 1 .. workers */
    uint64_t pass;               /* counts the passes handed out */
    uint64_t claim;              /* (atomic) the pass's count, low 32 bits, << 32 | next piece */
    int left;                    /* (atomic) this pass's pieces not yet done */
    int parts, pieces;
    part_task task;
    void *ctx;
    int64_t n, align;
    int kept_off;                /* the CPU the workers may not run on (the caller's), or -1 */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1};

/* 0: the workers wake and take no piece, the caller takes them all (the tests' check that a
 * pass never waits on a worker) */
int parts_workers_take = 1;

static pthread_t threads[MAX_PARTS];  /* worker i's */

static uint64_t born_at[MAX_PARTS];   /* the pass count when worker i started */
static pthread_once_t fork_handler_once = PTHREAD_ONCE_INIT;

/* Piece i's bounds: near-equal counts of `align`-sized blocks, the last block short. */
static void part_bounds(int64_t n, int parts, int64_t align, int i, int64_t *lo, int64_t *hi)
{
    int64_t blocks = (n + align - 1) / align;
    int64_t step = blocks / parts, extra = blocks % parts;
    int64_t first = i * step + (i < extra ? i : extra);
    int64_t count = step + (i < extra ? 1 : 0);
    *lo = first * align < n ? first * align : n;
    *hi = (first + count) * align < n ? (first + count) * align : n;
}

/* Takes pieces of pass `tag` (its fields as read with it) and does them, until none is left
 * or another pass has begun: a claim names its pass, so a worker late for one pass cannot take
 * a piece of the next with the first's task. */
static void take_pieces(uint32_t tag, part_task task, void *ctx, int64_t n, int pieces,
                        int64_t align)
{
    for (;;) {
        uint64_t claim = __atomic_load_n(&pool.claim, __ATOMIC_ACQUIRE);
        const int piece = (int)(uint32_t)claim;
        if ((uint32_t)(claim >> 32) != tag || piece >= pieces)
            return;
        if (!__atomic_compare_exchange_n(&pool.claim, &claim, claim + 1, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue;
        int64_t lo, hi;
        part_bounds(n, pieces, align, piece, &lo, &hi);
        task(ctx, lo, hi);
        if (__atomic_sub_fetch(&pool.left, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.finished);
            pthread_mutex_unlock(&pool.lock);
        }
    }
}

static void *worker(void *arg)
{
    int index = (int)(intptr_t)arg;
    uint64_t seen = born_at[index];
    for (;;) {
        pthread_mutex_lock(&pool.lock);
        while (pool.pass == seen)
            pthread_cond_wait(&pool.start, &pool.lock);
        seen = pool.pass;
        const int parts = pool.parts, pieces = pool.pieces;
        part_task task = pool.task;
        void *ctx = pool.ctx;
        int64_t n = pool.n, align = pool.align;
        pthread_mutex_unlock(&pool.lock);
        if (index < parts && parts_workers_take)
            take_pieces((uint32_t)seen, task, ctx, n, pieces, align);
    }
    return NULL;
}

/* In a child of fork(): the workers did not come along, and the locks may have been held by
 * a thread that did not either. */
static void forget_workers(void)
{
    pthread_mutex_init(&pool.call, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.start, NULL);
    pthread_cond_init(&pool.finished, NULL);
    pool.workers = 0;
    pool.left = 0;
    pool.kept_off = -1;
}

static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, forget_workers);
}

/* Starts workers up to part count-1; returns how many parts the threads can take. */
static int start_workers(int count)
{
    pthread_once(&fork_handler_once, register_fork_handler);
    while (pool.workers < count - 1) {
        int index = pool.workers + 1;
        pthread_attr_t attr;
        pthread_t thread;
        born_at[index] = pool.pass;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attr, worker, (void *)(intptr_t)index);
        pthread_attr_destroy(&attr);
        if (failed)
            break;
        threads[index] = thread;
        pool.workers = index;
        pool.kept_off = -1;
    }
    return pool.workers + 1;
}

/* Keeps the workers off the caller's CPU. Woken after a pause, a worker is put on the CPU of
 * the thread that woke it (the other core being idle) and waits there for the caller's part
 * to end: the parts ran one after the other (two of 375 us each: 470 us back to back, 790
 * after a pause of 2 ms). Asked again only when the caller has moved. */
static void keep_off_caller(void)
{
#ifdef CPU_SET                       /* Linux's (glibc's, musl's); elsewhere left as it is */
    const int cpu = sched_getcpu();
    if (cpu < 0 || cpu == pool.kept_off || cpu >= CPU_SETSIZE)
        return;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return;
    CPU_CLR(cpu, &allowed);
    if (CPU_COUNT(&allowed) == 0)
        return;
    for (int i = 1; i <= pool.workers; ++i)
        pthread_setaffinity_np(threads[i], sizeof allowed, &allowed);
    pool.kept_off = cpu;
#endif
}

void run_in_parts(part_task task, void *ctx, int64_t n, int parts, int64_t align)
{
    int64_t blocks = (n + align - 1) / align;
    if (parts > MAX_PARTS)
        parts = MAX_PARTS;
    if (parts > blocks)
        parts = (int)blocks;
    if (parts <= 1 || pthread_mutex_trylock(&pool.call) != 0) {
        task(ctx, 0, n);
        return;
    }
    int ready = start_workers(parts);
    if (parts > ready)
        parts = ready;
    keep_off_caller();
    const int pieces = blocks < (int64_t)parts * PIECES_A_PART ? (int)blocks
                                                               : parts * PIECES_A_PART;
    pthread_mutex_lock(&pool.lock);
    pool.task = task;
    pool.ctx = ctx;
    pool.n = n;
    pool.align = align;
    pool.parts = parts;
    pool.pieces = pieces;
    pool.pass++;
    __atomic_store_n(&pool.left, pieces, __ATOMIC_RELEASE);
    __atomic_store_n(&pool.claim, (uint64_t)(uint32_t)pool.pass << 32, __ATOMIC_RELEASE);
    const uint32_t tag = (uint32_t)pool.pass;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);
    take_pieces(tag, task, ctx, n, pieces, align);
    pthread_mutex_lock(&pool.lock);
    while (__atomic_load_n(&pool.left, __ATOMIC_ACQUIRE) > 0)
        pthread_cond_wait(&pool.finished, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.call);
}
