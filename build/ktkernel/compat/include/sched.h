/* Stand-in/extension of <sched.h> on Windows: sched_getcpu and the cpu_set_t affinity calls
 * kt-kernel uses. Under mingw the winpthreads <sched.h> comes first (it has sched_yield). */
#pragma once
#if defined(__MINGW32__)
#include_next <sched.h>
#endif
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef CPU_SETSIZE
#define CPU_SETSIZE 1024
typedef struct {
  unsigned long long bits[CPU_SETSIZE / 64];
} cpu_set_t;
#define CPU_ZERO(s) memset((s), 0, sizeof(cpu_set_t))
#define CPU_SET(c, s) ((s)->bits[(c) / 64] |= (1ULL << ((c) % 64)))
#define CPU_CLR(c, s) ((s)->bits[(c) / 64] &= ~(1ULL << ((c) % 64)))
#define CPU_ISSET(c, s) (((s)->bits[(c) / 64] >> ((c) % 64)) & 1ULL)
#endif

int sched_getcpu(void);
/* pid 0 = the calling thread (Linux semantics for sched_setaffinity); other pids: ESRCH. */
int sched_setaffinity(int pid, size_t size, const cpu_set_t* set);
int sched_getaffinity(int pid, size_t size, cpu_set_t* set);
#if !defined(__MINGW32__)
int sched_yield(void);
#endif

#ifdef __cplusplus
}
#endif
