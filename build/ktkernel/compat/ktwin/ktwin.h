// ktwin: the small portable API behind kt-kernel's Windows compat layer.
//
// Every POSIX/Linux stand-in in ../include (numa.h, unistd.h, sched.h, ...) is a thin C shim over
// these functions, and the project's own checks (../../checks) call them directly. The same
// implementation builds on Linux (where it is tested natively against the real kernel behaviour)
// and on Windows (clang-cl for the product, x86_64-w64-windows-gnu + Wine as the Linux-side proxy).
// No kt-kernel code is included or copied here.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(_WIN32)
#define KTWIN_WINDOWS 1
#else
#define KTWIN_WINDOWS 0
#endif

namespace ktwin {

// ---- threads ------------------------------------------------------------------------------------
// A thread handle as the OS sees it: HANDLE on Windows, pthread_t on Linux. On Windows, MSVC's
// std::thread::native_handle() already is a HANDLE; under mingw it is a winpthreads pthread_t and
// thread_handle_of() converts it (pthread_gethandle).
#if KTWIN_WINDOWS
using thread_handle = void*;
#else
using thread_handle = unsigned long;
#endif

thread_handle current_thread();
// Sets/gets the OS-visible thread name (SetThreadDescription/GetThreadDescription on Windows,
// pthread_setname_np on Linux). Returns 0 or an errno value, like pthread_setname_np.
int set_thread_name(thread_handle h, const char* name);
int get_thread_name(thread_handle h, char* buf, std::size_t len);
// Pins a thread to one logical CPU (SetThreadAffinityMask / pthread_setaffinity_np). 0 or errno.
int pin_thread(thread_handle h, int cpu);
// Logical CPU the calling thread runs on (GetCurrentProcessorNumber / sched_getcpu).
int current_cpu();
int cpu_count();

// ---- NUMA ---------------------------------------------------------------------------------------
// Topology from GetNumaHighestNodeNumber + GetNumaNodeProcessorMaskEx on Windows. When any of
// those calls fails (Wine lacks GetNumaNodeProcessorMaskEx: error 120), or on Linux builds of the
// checks, the layer falls back to one node holding every CPU, which is what kt-kernel needs to run.
int numa_node_count();
bool numa_fell_back();
int numa_node_of_cpu(int cpu);  // -1 when cpu is out of range

// ---- memory -------------------------------------------------------------------------------------
// Aligned blocks that the compat layer's free() (ktwin::free) releases, as POSIX allows for
// posix_memalign/aligned_alloc. The Windows CRT has no aligned_alloc and its free() cannot release
// an over-aligned block, so aligned blocks are remembered in a registry and free() looks there
// first; pointers that are not in it go to the CRT free() unchanged.
void* aligned_alloc(std::size_t alignment, std::size_t size);
int posix_memalign(void** out, std::size_t alignment, std::size_t size);
void free(void* p);
void* realloc(void* p, std::size_t size);
std::size_t live_aligned_blocks();

// ---- CPU features -------------------------------------------------------------------------------
struct CpuFeatures {
  bool avx2, fma, f16c;
  bool avx512f, avx512bw, avx512dq, avx512vl, avx512_vnni, avx512_vbmi, avx512_bf16;
  bool amx_tile, amx_bf16, amx_int8;
  bool os_avx, os_avx512, os_amx;  // XCR0 says the OS saves that register state
};
std::uint64_t xcr0();  // 0 when OSXSAVE is off
CpuFeatures cpu_features();
// kt-kernel's variant ladder (amx > avx512_bf16 > avx512_vbmi > avx512_vnni > avx512_base > avx2),
// decided from cpuid + XCR0 instead of /proc/cpuinfo. Returns a static string.
const char* choose_variant(const CpuFeatures& f);

// ---- AMX permission -----------------------------------------------------------------------------
// Emulates Linux arch_prctl(ARCH_GET_XCOMP_SUPP / ARCH_GET_XCOMP_PERM / ARCH_REQ_XCOMP_PERM).
// Windows enables AMX tile state for every process itself when the OS supports it, so "permission"
// is exactly XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA). `arg` is a pointer for the GET codes and
// the feature number for REQ. Note: `unsigned long` is 32-bit on Windows, 64-bit on Linux; the GET
// codes write exactly one `unsigned long`, as callers declare it. Returns 0, or -1 with errno set.
long arch_prctl(int code, std::uintptr_t arg);

}  // namespace ktwin
