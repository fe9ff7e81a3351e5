/* Loaded into every process the tests start (LD_PRELOAD, tests/conftest.py): sched_yield() sleeps 50 us instead of
 * returning at once. Horovod's PyTorch synchronize (WaitAndClear, horovod/torch/mpi_ops_v2.cc) waits for an
 * all-reduce by looping on std::this_thread::yield(), so a rank waiting for its peer keeps a core busy; on this
 * 2-core machine that core is the one the peer or the other pytest worker needs. A yield is a scheduling hint: no
 * caller may depend on its timing, and what the tests check is unchanged. TEST_YIELD_SLEEPS=0 leaves it out. */
#define _GNU_SOURCE
#include <sched.h>
#include <time.h>

int sched_yield(void) {
    struct timespec pause = {0, 50000};
    nanosleep(&pause, 0);
    return 0;
}
