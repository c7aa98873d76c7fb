/* The threads of one OpenMP parallel region working as a team, synchronized by our own barrier.
 *
 * Why not OpenMP's work-sharing: every `omp parallel` region wakes the pool's workers and every
 * `omp for` ends in libgomp's barrier, where a waiting thread spins GOMP_SPINCOUNT rounds and
 * then sleeps on a futex. libgomp throttles that spin to 1,000 rounds (microseconds) whenever
 * its pools hold more threads than there are CPUs -- which is the case as soon as two threads
 * of a process have run OpenMP work (the engine's loop thread and the thread that built the
 * model). A decode step of ~100 regions and ~200 barriers then pays a futex sleep and wake at
 * most of them (1B Q4_0 on 2 threads: 40 tok/s where the weights stream at 48+).
 *
 * Here a kernel body takes a `Team` (its thread's id and the team's size): loops are split by
 * `team_range` (OpenMP's static split) or drawn from `team_next` (dynamic), and threads meet at
 * `team_sync`, a sense-reversing barrier that spins with `pause` for longer than the gaps inside
 * a step and only then sleeps on a futex -- so the threads of a step meet without a sleep and
 * a wake, and a thread left waiting longer gives its CPU back. The decode stack runs a whole
 * step in one region (one wake a step); a standalone kernel opens its own region around the
 * same body, so each kernel has one implementation whoever calls it.
 *
 * team_sync also carries a status: every thread passes its own (0 or an error) and every
 * thread gets back the first nonzero one given at that barrier, so a failure seen by one
 * thread (thread 0's allocation, a bad block id) makes all of them leave at the same barrier.
 */
#ifndef LANGCHAIN_ASCEND_TEAM_H
#define LANGCHAIN_ASCEND_TEAM_H

#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Rounds of `pause` a waiting thread spins before it sleeps (tens of microseconds: longer than
   the gaps inside a decode step -- thread 0's norms and rotary, an imbalance between threads --
   so a step's threads never sleep, short enough that a waiting thread does not hold a CPU that
   another thread of the process needs: an asyncio loop starves behind a spinning team on
   2 cores, tests/chat_models/test_chat_model.py). */
#define TEAM_SPINS 1024

/* Work (multiply-adds) below which a per-op entry runs on its calling thread alone: waking a
   sleeping worker costs tens of microseconds, more than such a product takes on one thread. */
#define TEAM_MIN_WORK (1 << 18)

/* The threads a per-op entry opens its region with: 1 for work under TEAM_MIN_WORK. */
static inline int team_threads(int threads, double work) {
    return threads > 1 && work >= TEAM_MIN_WORK ? threads : 1;
}

typedef struct {
    _Alignas(64) atomic_int arrived;
    _Alignas(64) atomic_int phase;
    atomic_int sleepers;        /* threads asleep (futex) on phase */
    atomic_int status[2];       /* the status given at barriers of even / odd phase */
    _Alignas(64) atomic_llong next;  /* the dynamic loops' next item */
    void *shared;                /* what thread 0 publishes to the team (read after a sync) */
} TeamSync;

typedef struct {
    TeamSync *sync;
    int id, size;
} Team;

/* The calling thread's place in the innermost enclosing parallel region (a team of one
   outside any). `sync` is one zeroed TeamSync shared by the region's threads. */
static inline Team team_of(TeamSync *sync) {
    Team t = {sync, omp_get_thread_num(), omp_get_num_threads()};
    return t;
}

/* Meet every thread of the team; returns the first nonzero `status` any of them gave here
   (0 if none), the same value in every thread. Writes before it are visible after it. */
static inline int team_sync(const Team *t, int status) {
    if (t->size == 1) return status;
    TeamSync *s = t->sync;
    const int phase = atomic_load_explicit(&s->phase, memory_order_acquire);
    atomic_int *slot = &s->status[phase & 1];
    if (status) {
        int none = 0;
        atomic_compare_exchange_strong(slot, &none, status);
    }
    if (atomic_fetch_add_explicit(&s->arrived, 1, memory_order_acq_rel) == t->size - 1) {
        /* the last to arrive: clear the next phase's status (read by no one any more: every
           thread read it after the previous barrier, before arriving here), open the barrier */
        atomic_store_explicit(&s->status[(phase + 1) & 1], 0, memory_order_relaxed);
        atomic_store_explicit(&s->arrived, 0, memory_order_relaxed);
        atomic_store(&s->phase, phase + 1);
        if (atomic_load(&s->sleepers))
            syscall(SYS_futex, &s->phase, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    } else {
        for (int spins = 0; atomic_load_explicit(&s->phase, memory_order_acquire) == phase;) {
            if (spins < TEAM_SPINS) {
                _mm_pause();
                spins++;
                continue;
            }
            /* sleep until the phase moves (the futex returns at once if it already has; the
               opener wakes sleepers after it moves the phase) */
            atomic_fetch_add(&s->sleepers, 1);
            if (atomic_load(&s->phase) == phase)
                syscall(SYS_futex, &s->phase, FUTEX_WAIT_PRIVATE, phase, NULL, NULL, 0);
            atomic_fetch_sub(&s->sleepers, 1);
        }
    }
    return atomic_load_explicit(slot, memory_order_relaxed);
}

/* This thread's share [*lo, *hi) of n items, contiguous, as OpenMP's schedule(static). */
static inline void team_range(const Team *t, int64_t n, int64_t *lo, int64_t *hi) {
    int64_t q = n / t->size, r = n % t->size;
    *lo = t->id * q + (t->id < r ? t->id : r);
    *hi = *lo + q + (t->id < r);
}

/* Dynamic loops: thread 0 calls team_restart before the sync that precedes the loop; then
   each thread takes the next `chunk` items from team_next until it returns >= n. */
static inline void team_restart(const Team *t) {
    atomic_store_explicit(&t->sync->next, 0, memory_order_relaxed);
}

static inline int64_t team_next(const Team *t, int64_t chunk) {
    return atomic_fetch_add_explicit(&t->sync->next, chunk, memory_order_relaxed);
}

/* A per-op entry: `CALL`, a team body's call naming the team `t` (a const Team *), run by a
   region of team_threads(THREADS, WORK) threads; evaluates to thread 0's status. */
#define TEAM_RUN(THREADS, WORK, CALL)                                                            \
    ({                                                                                           \
        TeamSync team_sync_ = {0};                                                               \
        int team_status_ = 0;                                                                    \
        const int team_size_ = team_threads((THREADS), (WORK));                                  \
        _Pragma("omp parallel num_threads(team_size_)")                                         \
        {                                                                                        \
            const Team team_ = team_of(&team_sync_);                                             \
            const Team *t = &team_;                                                              \
            const int st_ = (CALL);                                                              \
            if (t->id == 0) team_status_ = st_;                                                  \
        }                                                                                        \
        team_status_;                                                                            \
    })

/* Thread 0 gives `p` to the team: every thread returns it (after a sync). */
static inline void *team_share(const Team *t, void *p) {
    if (t->id == 0) t->sync->shared = p;
    team_sync(t, 0);
    return t->sync->shared;
}

#endif
