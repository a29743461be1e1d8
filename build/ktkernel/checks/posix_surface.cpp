// The POSIX/Linux surface kt-kernel uses, called the way kt-kernel's sources call it (headers,
// names, argument types), written from scratch for this project. Natively it compiles against the
// real glibc + libnuma; for Windows it compiles against the compat layer's stand-in headers. The
// two builds must print the same lines: that is the evidence the stand-ins behave like Linux here.
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {
// Same request sequence as a Linux AMX user: supported? permitted? else request XTILEDATA.
constexpr int kGetSupp = 0x1021, kGetPerm = 0x1022, kReqPerm = 0x1023, kXtileData = 18;
constexpr unsigned long kXtileMask = (1UL << 17) | (1UL << 18);

int amx_permitted() {
  unsigned long features = 0;
  long rc = syscall(SYS_arch_prctl, kGetSupp, &features);
  if (rc || (features & kXtileMask) != kXtileMask) return 0;
  unsigned long bitmask = 0;
  if (syscall(SYS_arch_prctl, kGetPerm, &bitmask)) return 0;
  if (bitmask & (1UL << kXtileData)) return 1;
  if (syscall(SYS_arch_prctl, kReqPerm, kXtileData)) return 0;
  return syscall(SYS_arch_prctl, kGetPerm, &bitmask) == 0 && (bitmask & (1UL << kXtileData));
}
}  // namespace

int run_posix_surface() {
  // NUMA: availability, node count, node of the current CPU, binding and node-local memory.
  const int avail = numa_available();
  const int nodes = numa_num_configured_nodes();
  const int node = numa_node_of_cpu(sched_getcpu());
  struct bitmask* mask = numa_bitmask_alloc(nodes);
  numa_bitmask_setbit(mask, 0);
  numa_bind(mask);
  numa_bitmask_free(mask);
  const std::size_t sz = 1 << 20;
  auto* mem = static_cast<unsigned char*>(numa_alloc_onnode(sz, 0));
  int mem_ok = mem != nullptr;
  if (mem) {
    std::memset(mem, 1, sz);
    mem_ok = mem[sz - 1] == 1 && (reinterpret_cast<std::uintptr_t>(mem) % 4096) == 0;
    numa_free(mem, sz);
  }
  const long pol = set_mempolicy(MPOL_DEFAULT, nullptr, 0);

  // CPUs, affinity of the calling thread.
  const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  const int aff = sched_setaffinity(0, sizeof(set), &set);
  int on0 = 1;
  for (int i = 0; i < 20; ++i) {
    sched_yield();
    on0 &= sched_getcpu() == 0;
  }

  // Thread naming through std::thread::native_handle(), as kt-kernel's worker pool does it.
  std::thread t([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  const int set_rc = pthread_setname_np(t.native_handle(), "numa_0_t_7");
  char name[16] = {};
  const int get_rc = pthread_getname_np(t.native_handle(), name, sizeof name);
  t.join();

  // Allocation released by free().
  void* p = nullptr;
  const int pm = posix_memalign(&p, 64, 1000);
  int align_ok = pm == 0 && (reinterpret_cast<std::uintptr_t>(p) % 64) == 0;
  free(p);
  void* q = std::aligned_alloc(4096, 8192);
  align_ok &= q && (reinterpret_cast<std::uintptr_t>(q) % 4096) == 0;
  std::free(q);

  // No child processes: waitpid reports ECHILD.
  int status = 0;
  errno = 0;
  const int w = waitpid(-1, &status, WNOHANG);
  const int w_errno = errno;

  std::printf("posix.numa_available=%d\nposix.nodes=%d\nposix.node_of_current_cpu=%d\nposix.numa_mem_ok=%d\n",
              avail >= 0, nodes, node, mem_ok);
  std::printf("posix.set_mempolicy=%ld\nposix.ncpu_matches=%d\nposix.affinity_rc=%d\nposix.on_cpu0=%d\n", pol,
              ncpu == static_cast<long>(std::thread::hardware_concurrency()), aff, on0);
  std::printf("posix.setname_rc=%d\nposix.getname_rc=%d\nposix.name=%s\nposix.align_ok=%d\n", set_rc, get_rc, name,
              align_ok);
  std::printf("posix.waitpid=%d\nposix.waitpid_echild=%d\nposix.amx_permitted=%d\n", w, w_errno == ECHILD,
              amx_permitted());
  return 0;
}
