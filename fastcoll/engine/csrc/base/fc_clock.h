/* Monotonic time in nanoseconds, and deadlines on it. */
#ifndef FC_CLOCK_H
#define FC_CLOCK_H

#include <stdint.h>
#include <time.h>

typedef int64_t fc_ns;

#define FC_NS_PER_S 1000000000LL
#define FC_FOREVER INT64_MAX

static inline fc_ns fc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (fc_ns)ts.tv_sec * FC_NS_PER_S + ts.tv_nsec;
}

/* now + seconds, saturating at FC_FOREVER (Python passes time limits up to 1e9 s). */
static inline fc_ns fc_deadline_in(double seconds)
{
    if (!(seconds < 9.0e9))
        return FC_FOREVER;
    if (seconds <= 0)
        return fc_now();
    return fc_now() + (fc_ns)(seconds * 1e9);
}

#endif
