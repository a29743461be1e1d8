// C-ABI stand-ins behind ../include (numa.h, numaif.h, sched.h, unistd.h, sys/wait.h) and the
// MSVC pthread naming header. Windows only: on Linux the real libc/libnuma provide these names.
// Each one is a thin wrapper over ktwin (ktwin.cpp), where the behaviour lives and is tested.
#define KTWIN_BUILDING 1
#include "../ktwin/ktwin.h"

#if !KTWIN_WINDOWS
#error "posix_shims.cpp is for Windows targets only"
#endif

#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include "../include/numa.h"
#include "../include/numaif.h"
#include "../include/sched.h"
#include "../include/sys/syscall.h"
#include "../include/sys/wait.h"
#include "../include/unistd.h"

extern "C" {

// ---- numa.h -------------------------------------------------------------------------------------
int numa_available(void) { return 0; }  // >= 0: "available" (possibly as the one-node fallback)
int numa_max_node(void) { return ktwin::numa_node_count() - 1; }
int numa_num_configured_nodes(void) { return ktwin::numa_node_count(); }
int numa_num_configured_cpus(void) { return ktwin::cpu_count(); }
int numa_node_of_cpu(int cpu) {
  int n = ktwin::numa_node_of_cpu(cpu);
  if (n < 0) errno = EINVAL;
  return n;
}

struct bitmask* numa_bitmask_alloc(unsigned int nbits) {
  auto* b = static_cast<struct bitmask*>(std::calloc(1, sizeof(struct bitmask)));
  if (!b) return nullptr;
  const unsigned long words = (nbits + 8 * sizeof(unsigned long) - 1) / (8 * sizeof(unsigned long));
  b->maskp = static_cast<unsigned long*>(std::calloc(words ? words : 1, sizeof(unsigned long)));
  b->size = nbits;
  return b;
}
void numa_bitmask_free(struct bitmask* b) {
  if (!b) return;
  std::free(b->maskp);
  std::free(b);
}
struct bitmask* numa_bitmask_setbit(struct bitmask* b, unsigned int n) {
  const unsigned bits = 8 * sizeof(unsigned long);
  if (n < b->size) b->maskp[n / bits] |= 1UL << (n % bits);
  return b;
}
struct bitmask* numa_bitmask_clearall(struct bitmask* b) {
  const unsigned bits = 8 * sizeof(unsigned long);
  std::memset(b->maskp, 0, ((b->size + bits - 1) / bits) * sizeof(unsigned long));
  return b;
}
int numa_bitmask_isbitset(const struct bitmask* b, unsigned int n) {
  const unsigned bits = 8 * sizeof(unsigned long);
  return n < b->size && ((b->maskp[n / bits] >> (n % bits)) & 1UL);
}
struct bitmask* numa_allocate_nodemask(void) { return numa_bitmask_alloc(64); }
void numa_free_nodemask(struct bitmask* b) { numa_bitmask_free(b); }
void numa_bind(struct bitmask*) {}
void numa_set_membind(struct bitmask*) {}
void numa_set_preferred(int) {}
void numa_set_localalloc(void) {}
int numa_run_on_node(int node) {
  if (node < -1 || node >= ktwin::numa_node_count()) {
    errno = EINVAL;
    return -1;
  }
  return 0;
}
// VirtualAlloc: page-aligned and zeroed like libnuma's mmap-backed blocks, released by numa_free.
void* numa_alloc_onnode(size_t size, int) {
  return VirtualAlloc(nullptr, size, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
}
void* numa_alloc_local(size_t size) { return numa_alloc_onnode(size, 0); }
void* numa_alloc(size_t size) { return numa_alloc_onnode(size, 0); }
void numa_free(void* mem, size_t) {
  if (mem) VirtualFree(mem, 0, MEM_RELEASE);
}

// ---- numaif.h -----------------------------------------------------------------------------------
long set_mempolicy(int, const unsigned long*, unsigned long) { return 0; }
long get_mempolicy(int* mode, unsigned long*, unsigned long, void*, unsigned long) {
  if (mode) *mode = MPOL_DEFAULT;
  return 0;
}
long mbind(void*, unsigned long, int, const unsigned long*, unsigned long, unsigned) { return 0; }

// ---- sched.h ------------------------------------------------------------------------------------
int sched_getcpu(void) { return ktwin::current_cpu(); }
int sched_setaffinity(int pid, size_t, const cpu_set_t* set) {
  if (pid != 0) {
    errno = ESRCH;
    return -1;
  }
  DWORD_PTR mask = 0;
  for (int c = 0; c < 64; ++c)
    if (CPU_ISSET(c, set)) mask |= DWORD_PTR(1) << c;
  if (!mask || !SetThreadAffinityMask(GetCurrentThread(), mask)) {
    errno = EINVAL;
    return -1;
  }
  return 0;
}
int sched_getaffinity(int pid, size_t, cpu_set_t* set) {
  if (pid != 0) {
    errno = ESRCH;
    return -1;
  }
  DWORD_PTR process_mask = 0, system_mask = 0;
  GetProcessAffinityMask(GetCurrentProcess(), &process_mask, &system_mask);
  CPU_ZERO(set);
  for (int c = 0; c < 64; ++c)
    if ((process_mask >> c) & 1) CPU_SET(c, set);
  return 0;
}
#if !defined(__MINGW32__)
int sched_yield(void) {
  SwitchToThread();
  return 0;
}
#endif

// ---- unistd.h -----------------------------------------------------------------------------------
long sysconf(int name) {
  SYSTEM_INFO si;
  GetSystemInfo(&si);
  switch (name) {
    case _SC_NPROCESSORS_CONF:
    case _SC_NPROCESSORS_ONLN:
      return static_cast<long>(si.dwNumberOfProcessors);
    case _SC_PAGESIZE:
      return static_cast<long>(si.dwPageSize);
    default:
      errno = EINVAL;
      return -1;
  }
}

long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long rc = -1;
  if (number == SYS_arch_prctl) {
    const int code = va_arg(ap, int);
    const std::uintptr_t arg = va_arg(ap, std::uintptr_t);
    rc = ktwin::arch_prctl(code, arg);
  } else if (number == SYS_gettid) {
    rc = static_cast<long>(GetCurrentThreadId());
  } else {
    errno = ENOSYS;
  }
  va_end(ap);
  return rc;
}

#if !defined(__MINGW32__)
int usleep(unsigned int usec) {
  Sleep((usec + 999) / 1000);
  return 0;
}
#endif

// ---- sys/wait.h ---------------------------------------------------------------------------------
int waitpid(int, int*, int) {
  errno = ECHILD;
  return -1;
}

// ---- pthread naming -----------------------------------------------------------------------------
#if defined(_MSC_VER)
// pthread_t is a HANDLE here (include-msvc/pthread.h).
void* pthread_self(void) { return GetCurrentThread(); }
int pthread_setname_np(void* thread, const char* name) { return ktwin::set_thread_name(thread, name); }
int pthread_getname_np(void* thread, char* name, size_t len) { return ktwin::get_thread_name(thread, name, len); }
#endif

}  // extern "C"
