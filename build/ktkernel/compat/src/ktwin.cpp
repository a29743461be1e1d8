// Implementation of ktwin.h. Compiled into the compat library (ktwin_compat.lib, also handed to
// kt-kernel's CMake as NUMA_LIBRARY) and into the project's checks. Never force-includes
// ktwin_compat.h itself: the allocation macros there must not rename the real CRT calls used here.
#define KTWIN_BUILDING 1
#include "../ktwin/ktwin.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#if KTWIN_WINDOWS
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#include <intrin.h>
#if defined(__MINGW32__)
#include <pthread.h>
#endif
#else
#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

namespace ktwin {

// ---- threads ------------------------------------------------------------------------------------
#if KTWIN_WINDOWS
namespace {
// Resolved at run time: SetThreadDescription exists from Windows 10 1607 on, and mingw-w64 v10
// headers do not declare it.
using SetDescFn = HRESULT(WINAPI*)(HANDLE, PCWSTR);
using GetDescFn = HRESULT(WINAPI*)(HANDLE, PWSTR*);
template <class F>
F kernel32_fn(const char* name) {
  HMODULE k = GetModuleHandleW(L"kernel32.dll");
  return k ? reinterpret_cast<F>(reinterpret_cast<void*>(GetProcAddress(k, name))) : nullptr;
}
}  // namespace

thread_handle current_thread() { return GetCurrentThread(); }

int set_thread_name(thread_handle h, const char* name) {
  static const SetDescFn set_desc = kernel32_fn<SetDescFn>("SetThreadDescription");
  if (!set_desc) return ENOSYS;
  wchar_t wide[64];
  if (MultiByteToWideChar(CP_UTF8, 0, name, -1, wide, 64) == 0) return EINVAL;
  // SUCCEEDED, not == S_OK: Wine 8 returns HRESULT_FROM_NT(STATUS_SUCCESS) = 0x10000000.
  return SUCCEEDED(set_desc(static_cast<HANDLE>(h), wide)) ? 0 : EINVAL;
}

int get_thread_name(thread_handle h, char* buf, std::size_t len) {
  static const GetDescFn get_desc = kernel32_fn<GetDescFn>("GetThreadDescription");
  if (!get_desc || len == 0) return ENOSYS;
  PWSTR wide = nullptr;
  if (!SUCCEEDED(get_desc(static_cast<HANDLE>(h), &wide)) || !wide) return EINVAL;
  int n = WideCharToMultiByte(CP_UTF8, 0, wide, -1, buf, static_cast<int>(len), nullptr, nullptr);
  LocalFree(wide);
  if (n == 0) return ERANGE;
  return 0;
}

int pin_thread(thread_handle h, int cpu) {
  if (cpu < 0 || cpu >= 64) return EINVAL;  // one processor group is enough for the check
  return SetThreadAffinityMask(static_cast<HANDLE>(h), DWORD_PTR(1) << cpu) ? 0 : EINVAL;
}

int current_cpu() { return static_cast<int>(GetCurrentProcessorNumber()); }

int cpu_count() {
  SYSTEM_INFO si;
  GetSystemInfo(&si);
  return static_cast<int>(si.dwNumberOfProcessors);
}
#else
thread_handle current_thread() { return pthread_self(); }
int set_thread_name(thread_handle h, const char* name) { return pthread_setname_np(h, name); }
int get_thread_name(thread_handle h, char* buf, std::size_t len) { return pthread_getname_np(h, buf, len); }
int pin_thread(thread_handle h, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(h, sizeof(set), &set);
}
int current_cpu() { return sched_getcpu(); }
int cpu_count() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }
#endif

// ---- NUMA ---------------------------------------------------------------------------------------
namespace {
struct Topology {
  int nodes = 1;
  bool fell_back = true;
  unsigned long long mask[64] = {};  // processor-group-0 mask per node
};

Topology probe_topology() {
  Topology t;
#if KTWIN_WINDOWS
  ULONG highest = 0;
  if (!GetNumaHighestNodeNumber(&highest) || highest >= 64) return t;
  Topology real;
  real.nodes = static_cast<int>(highest) + 1;
  real.fell_back = false;
  for (ULONG n = 0; n <= highest; ++n) {
    GROUP_AFFINITY ga;
    std::memset(&ga, 0, sizeof(ga));
    if (!GetNumaNodeProcessorMaskEx(static_cast<USHORT>(n), &ga)) return t;  // Wine: error 120
    real.mask[n] = ga.Group == 0 ? static_cast<unsigned long long>(ga.Mask) : 0;
  }
  return real;
#else
  return t;  // Linux builds of the checks exercise the fallback; real Linux uses libnuma.
#endif
}

const Topology& topology() {
  static const Topology t = probe_topology();
  return t;
}
}  // namespace

int numa_node_count() { return topology().nodes; }
bool numa_fell_back() { return topology().fell_back; }
int numa_node_of_cpu(int cpu) {
  if (cpu < 0 || cpu >= cpu_count()) return -1;
  const Topology& t = topology();
  if (t.fell_back) return 0;
  for (int n = 0; n < t.nodes; ++n)
    if (cpu < 64 && (t.mask[n] >> cpu) & 1ULL) return n;
  return 0;
}

// ---- memory -------------------------------------------------------------------------------------
namespace {
struct Block {
  void* base;
  std::size_t size;
};
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<void*, Block>& registry() {
  static auto* r = new std::unordered_map<void*, Block>();  // never destroyed: frees may run late
  return *r;
}
}  // namespace

int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
  if (!out || alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* base = std::malloc(size + alignment);
  if (!base) return ENOMEM;
  auto addr = reinterpret_cast<std::uintptr_t>(base);
  void* aligned = reinterpret_cast<void*>((addr + alignment) & ~(std::uintptr_t(alignment) - 1));
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry()[aligned] = Block{base, size};
  }
  *out = aligned;
  return 0;
}

void* aligned_alloc(std::size_t alignment, std::size_t size) {
  void* p = nullptr;
  int rc = posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, size);
  if (rc) {
    errno = rc;
    return nullptr;
  }
  return p;
}

void free(void* p) {
  if (!p) return;
  void* base = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(p);
    if (it != registry().end()) {
      base = it->second.base;
      registry().erase(it);
    }
  }
  std::free(base ? base : p);  // not ours: a plain malloc'd pointer, released unchanged
}

void* realloc(void* p, std::size_t size) {
  if (!p) return std::realloc(p, size);
  std::size_t old_size = 0;
  std::size_t alignment = 0;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(p);
    if (it == registry().end()) return std::realloc(p, size);
    old_size = it->second.size;
    // Keep the block's alignment: the largest power of two dividing the address, capped.
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    alignment = static_cast<std::size_t>(addr & (~addr + 1));
    if (alignment > 4096) alignment = 4096;
  }
  void* q = aligned_alloc(alignment, size);
  if (!q) return nullptr;
  std::memcpy(q, p, old_size < size ? old_size : size);
  free(p);
  return q;
}

std::size_t live_aligned_blocks() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry().size();
}

// ---- CPU features -------------------------------------------------------------------------------
namespace {
void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
#if KTWIN_WINDOWS
  int regs[4];
  __cpuidex(regs, static_cast<int>(leaf), static_cast<int>(sub));
  for (int i = 0; i < 4; ++i) r[i] = static_cast<unsigned>(regs[i]);
#else
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
#endif
}

// Inline asm rather than _xgetbv: same spelling for g++, clang and clang-cl, no -mxsave needed.
std::uint64_t read_xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}
}  // namespace

std::uint64_t xcr0() {
  unsigned r[4];
  cpuid(1, 0, r);
  const bool osxsave = (r[2] >> 27) & 1;
  return osxsave ? read_xcr0() : 0;
}

CpuFeatures cpu_features() {
  CpuFeatures f{};
  unsigned r[4];
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  cpuid(1, 0, r);
  f.fma = (r[2] >> 12) & 1;
  f.f16c = (r[2] >> 29) & 1;
  const std::uint64_t x = xcr0();
  f.os_avx = (x & 0x6) == 0x6;                      // XMM + YMM state
  f.os_avx512 = f.os_avx && (x & 0xE0) == 0xE0;     // opmask, ZMM_Hi256, Hi16_ZMM
  f.os_amx = (x & (3ULL << 17)) == (3ULL << 17);    // XTILECFG (17) + XTILEDATA (18)
  if (max_leaf >= 7) {
    cpuid(7, 0, r);
    const unsigned ebx = r[1], ecx = r[2], edx = r[3];
    f.avx2 = (ebx >> 5) & 1;
    f.avx512f = (ebx >> 16) & 1;
    f.avx512dq = (ebx >> 17) & 1;
    f.avx512bw = (ebx >> 30) & 1;
    f.avx512vl = (ebx >> 31) & 1;
    f.avx512_vbmi = (ecx >> 1) & 1;
    f.avx512_vnni = (ecx >> 11) & 1;
    f.amx_bf16 = (edx >> 22) & 1;
    f.amx_tile = (edx >> 24) & 1;
    f.amx_int8 = (edx >> 25) & 1;
    const unsigned max_sub = r[0];
    if (max_sub >= 1) {
      cpuid(7, 1, r);
      f.avx512_bf16 = (r[0] >> 5) & 1;
    }
  }
  return f;
}

const char* choose_variant(const CpuFeatures& f) {
  const bool avx512_base = f.os_avx512 && f.avx512f && f.avx512bw;
  const bool vnni = avx512_base && f.avx512_vnni;
  const bool vbmi = vnni && f.avx512_vbmi;
  const bool bf16 = vbmi && f.avx512_bf16;
  const bool amx = bf16 && f.os_amx && f.amx_tile && f.amx_int8 && f.amx_bf16;
  if (amx) return "amx";
  if (bf16) return "avx512_bf16";
  if (vbmi) return "avx512_vbmi";
  if (vnni) return "avx512_vnni";
  if (avx512_base) return "avx512_base";
  return "avx2";  // kt-kernel's terminal fallback, also when AVX2 itself is missing
}

// ---- AMX permission -----------------------------------------------------------------------------
long arch_prctl(int code, std::uintptr_t arg) {
  constexpr int kGetSupp = 0x1021, kGetPerm = 0x1022, kReqPerm = 0x1023;
  const std::uint64_t x = xcr0();
  switch (code) {
    case kGetSupp:
    case kGetPerm: {
      if (!arg) {
        errno = EFAULT;
        return -1;
      }
      // Windows has no per-process opt-in: every XCR0 component is usable by the process.
      *reinterpret_cast<unsigned long*>(arg) = static_cast<unsigned long>(x);
      return 0;
    }
    case kReqPerm:
      if (arg == 17 || arg == 18) {
        if ((x >> arg) & 1) return 0;
      }
      errno = EINVAL;
      return -1;
    default:
      errno = EINVAL;
      return -1;
  }
}

}  // namespace ktwin

// ---- C entry points used by the force-included ktwin_compat.h -----------------------------------
extern "C" {
void* ktwin_aligned_alloc(std::size_t alignment, std::size_t size) { return ktwin::aligned_alloc(alignment, size); }
int ktwin_posix_memalign(void** out, std::size_t alignment, std::size_t size) {
  return ktwin::posix_memalign(out, alignment, size);
}
void ktwin_free(void* p) { ktwin::free(p); }
void* ktwin_realloc(void* p, std::size_t size) { return ktwin::realloc(p, size); }

#if defined(__MINGW32__)
// mingw: std::thread::native_handle() is a winpthreads pthread_t; name the OS thread behind it so
// the name is the one Windows tools (and GetThreadDescription) show, as with MSVC.
int ktwin_pthread_setname_np(pthread_t t, const char* name) {
  return ktwin::set_thread_name(pthread_gethandle(t), name);
}
int ktwin_pthread_getname_np(pthread_t t, char* name, std::size_t len) {
  return ktwin::get_thread_name(pthread_gethandle(t), name, len);
}
#endif
}
