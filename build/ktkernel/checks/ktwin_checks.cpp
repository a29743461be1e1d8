// The project's own C++ checks of the kt-kernel Windows compat layer (no kt-kernel code here).
// Built natively (Linux) and cross-built for x86_64-w64-windows-gnu (run under Wine) by
// tests/build; each subcommand prints `key=value` lines that the tests compare across both builds.
//
//   ktwin_checks pool | numa | alloc | amx | variant | gemv DIR | posix
//
// The force-included ktwin_compat.h is active in both builds (KTWIN_COMPAT_FORCE on Linux), so
// free()/posix_memalign() below are the compat layer's, as they would be inside kt-kernel.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ktwin/ktwin.h"

#if defined(__MINGW32__)
#include <pthread.h>
#endif

int run_posix_surface();  // posix_surface.cpp

namespace {

ktwin::thread_handle handle_of(std::thread& t) {
#if defined(__MINGW32__)
  return pthread_gethandle(t.native_handle());  // winpthreads pthread_t -> HANDLE
#else
  return reinterpret_cast<ktwin::thread_handle>(t.native_handle());  // HANDLE (MSVC) / pthread_t
#endif
}

// A thread pool shaped like kt-kernel's per-NUMA worker pool: workers named "numa_<n>_t_<i>" and
// pinned one per CPU by the creating thread, then sharing work through an atomic counter.
int check_pool() {
  const int ncpu = ktwin::cpu_count();
  const int nthreads = ncpu < 4 ? ncpu : 4;
  const int numa = ktwin::numa_node_of_cpu(0);
  std::atomic<bool> start{false};
  std::atomic<int> next{0};
  std::atomic<long long> total{0};
  constexpr int kTasks = 20000;
  std::vector<int> pinned_ok(nthreads, 0), self_name_ok(nthreads, 0);
  std::vector<std::string> names(nthreads);
  std::vector<std::thread> workers;
  for (int i = 0; i < nthreads; ++i) {
    names[i] = "numa_" + std::to_string(numa) + "_t_" + std::to_string(i);
    workers.emplace_back([&, i] {
      while (!start.load(std::memory_order_acquire)) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the new affinity apply
      int good = 0;
      for (int k = 0; k < 50; ++k) {
        good += ktwin::current_cpu() == i % ncpu;
        std::this_thread::yield();
      }
      pinned_ok[i] = good == 50;
      char buf[64] = {};
      self_name_ok[i] = ktwin::get_thread_name(ktwin::current_thread(), buf, sizeof buf) == 0 && names[i] == buf;
      long long local = 0;
      for (int t; (t = next.fetch_add(1)) < kTasks;) local += t;
      total.fetch_add(local);
    });
  }
  int set_ok = 1, get_ok = 1;
  for (int i = 0; i < nthreads; ++i) {
    ktwin::thread_handle h = handle_of(workers[i]);
    set_ok &= ktwin::set_thread_name(h, names[i].c_str()) == 0;
    set_ok &= ktwin::pin_thread(h, i % ncpu) == 0;
    char buf[64] = {};
    get_ok &= ktwin::get_thread_name(h, buf, sizeof buf) == 0 && names[i] == buf;
  }
  start.store(true, std::memory_order_release);
  for (auto& w : workers) w.join();
  int pinned = 1, self = 1;
  for (int i = 0; i < nthreads; ++i) {
    pinned &= pinned_ok[i];
    self &= self_name_ok[i];
  }
  std::printf("pool.threads=%d\npool.set_ok=%d\npool.name_from_creator_ok=%d\npool.name_from_self_ok=%d\n",
              nthreads, set_ok, get_ok, self);
  std::printf("pool.pinned_ok=%d\npool.sum=%lld\npool.sum_expected=%lld\npool.name0=%s\n", pinned,
              total.load(), static_cast<long long>(kTasks) * (kTasks - 1) / 2, names[0].c_str());
  return 0;
}

int check_numa() {
  std::printf("numa.nodes=%d\nnuma.fell_back=%d\nnuma.node_of_cpu0=%d\nnuma.node_of_bad_cpu=%d\n",
              ktwin::numa_node_count(), ktwin::numa_fell_back() ? 1 : 0, ktwin::numa_node_of_cpu(0),
              ktwin::numa_node_of_cpu(ktwin::cpu_count() + 7));
  return 0;
}

// posix_memalign / std::aligned_alloc / realloc, released by plain free() and std::free, as
// kt-kernel does. A block that free() failed to release stays in the registry (alloc.live_after).
int check_alloc() {
  int ok = 1;
  const std::size_t before = ktwin::live_aligned_blocks();
  for (std::size_t align : {16u, 64u, 4096u, 1u << 21}) {
    void* p = nullptr;
    ok &= posix_memalign(&p, align, 3 * align + 5) == 0;
    ok &= (reinterpret_cast<std::uintptr_t>(p) % align) == 0;
    std::memset(p, 0xAB, 3 * align + 5);
    free(p);
    void* q = std::aligned_alloc(align, 2 * align);
    ok &= q && (reinterpret_cast<std::uintptr_t>(q) % align) == 0;
    std::free(q);
  }
  // realloc keeps contents and alignment of an aligned block
  void* r = nullptr;
  ok &= posix_memalign(&r, 64, 64) == 0;
  for (int i = 0; i < 64; ++i) static_cast<unsigned char*>(r)[i] = static_cast<unsigned char>(i);
  r = realloc(r, 1 << 16);
  for (int i = 0; i < 64; ++i) ok &= static_cast<unsigned char*>(r)[i] == i;
  ok &= (reinterpret_cast<std::uintptr_t>(r) % 64) == 0;
  free(r);
  // unique_ptr with &free as deleter (a common kt-kernel pattern)
  { std::unique_ptr<void, decltype(&free)> u(std::aligned_alloc(64, 256), &free); ok &= u != nullptr; }
  // a plain malloc'd pointer passes through free() untouched
  void* m = std::malloc(100);
  free(m);
  int bad = posix_memalign(&r, 3, 8);  // not a power of two
  const int live = static_cast<int>(ktwin::live_aligned_blocks() - before);
  std::printf("alloc.ok=%d\nalloc.live_after=%d\nalloc.bad_alignment_rc=%d\n", ok, live, bad == EINVAL);
  return 0;
}

int check_amx() {
  const std::uint64_t x = ktwin::xcr0();
  unsigned long supp = 0, perm = 0;
  const long rs = ktwin::arch_prctl(0x1021, reinterpret_cast<std::uintptr_t>(&supp));
  const long rp = ktwin::arch_prctl(0x1022, reinterpret_cast<std::uintptr_t>(&perm));
  errno = 0;
  const long rq = ktwin::arch_prctl(0x1023, 18);
  const int req_errno = rq ? errno : 0;
  std::printf("amx.xcr0_tile_bits=%d\namx.supp_rc=%ld\namx.supp_tile_bits=%d\namx.perm_rc=%ld\n",
              static_cast<int>((x >> 17) & 3), rs, static_cast<int>((supp >> 17) & 3), rp);
  std::printf("amx.req_rc=%ld\namx.req_errno_einval=%d\namx.cpu_has_amx_tile=%d\n", rq, req_errno == EINVAL,
              ktwin::cpu_features().amx_tile ? 1 : 0);
  return 0;
}

int check_variant() {
  const ktwin::CpuFeatures f = ktwin::cpu_features();
  std::printf("variant.avx2=%d\nvariant.avx512f=%d\nvariant.avx512bw=%d\nvariant.avx512vl=%d\n", f.avx2, f.avx512f,
              f.avx512bw, f.avx512vl);
  std::printf("variant.avx512_vnni=%d\nvariant.avx512_vbmi=%d\nvariant.avx512_bf16=%d\n", f.avx512_vnni,
              f.avx512_vbmi, f.avx512_bf16);
  std::printf("variant.amx_tile=%d\nvariant.amx_bf16=%d\nvariant.amx_int8=%d\n", f.amx_tile, f.amx_bf16, f.amx_int8);
  std::printf("variant.os_avx=%d\nvariant.os_avx512=%d\nvariant.os_amx=%d\nvariant.choice=%s\n", f.os_avx,
              f.os_avx512, f.os_amx, ktwin::choose_variant(f));
  // The ladder itself, on synthetic feature sets (independent of this CPU).
  ktwin::CpuFeatures s{};
  s.os_avx = s.os_avx512 = s.os_amx = true;
  s.avx2 = true;
  std::printf("variant.ladder=%s", ktwin::choose_variant(s));
  s.avx512f = s.avx512bw = true;
  std::printf(",%s", ktwin::choose_variant(s));
  s.avx512_vnni = true;
  std::printf(",%s", ktwin::choose_variant(s));
  s.avx512_vbmi = true;
  std::printf(",%s", ktwin::choose_variant(s));
  s.avx512_bf16 = true;
  std::printf(",%s", ktwin::choose_variant(s));
  s.amx_tile = s.amx_bf16 = s.amx_int8 = true;
  std::printf(",%s", ktwin::choose_variant(s));
  s.os_amx = false;  // CPU has AMX but the OS does not save tile state
  std::printf(",%s\n", ktwin::choose_variant(s));
  return 0;
}

// ---- MXFP4 x bf16 GEMV ---------------------------------------------------------------------------
// Weights in kt-kernel's MXFP4 layout: nibbles [N, K/2] (low nibble = column 2j, high = 2j+1) and
// E8M0 scales [N, K/32], widened to bf16 by `e << 7` as kt-kernel does. x is bf16 [K]; y is fp32.
float bf16_to_float(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool read_file(const std::string& path, void* dst, std::size_t n) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  const std::size_t got = std::fread(dst, 1, n, f);
  std::fclose(f);
  return got == n;
}

int check_gemv(const std::string& dir) {
  static const float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  long n = 0, k = 0;
  FILE* meta = std::fopen((dir + "/meta.txt").c_str(), "r");
  if (!meta || std::fscanf(meta, "%ld %ld", &n, &k) != 2 || k % 32) {
    std::fprintf(stderr, "bad meta.txt\n");
    return 2;
  }
  std::fclose(meta);
  // Buffers through the compat layer's aligned allocation, as kt-kernel's weight buffers are.
  void *packed = nullptr, *scales = nullptr, *x = nullptr, *y = nullptr;
  if (posix_memalign(&packed, 64, n * k / 2) || posix_memalign(&scales, 64, n * k / 32) ||
      posix_memalign(&x, 64, k * 2) || posix_memalign(&y, 64, n * 4))
    return 3;
  if (!read_file(dir + "/packed.bin", packed, n * k / 2) || !read_file(dir + "/scales.bin", scales, n * k / 32) ||
      !read_file(dir + "/x.bin", x, k * 2)) {
    std::fprintf(stderr, "cannot read operands\n");
    return 2;
  }
  const auto* pk = static_cast<const std::uint8_t*>(packed);
  const auto* sc = static_cast<const std::uint8_t*>(scales);
  const auto* xb = static_cast<const std::uint16_t*>(x);
  auto* yf = static_cast<float*>(y);
  for (long r = 0; r < n; ++r) {
    float acc = 0.0f;
    for (long b = 0; b < k / 32; ++b) {
      const float scale = bf16_to_float(static_cast<std::uint16_t>(sc[r * (k / 32) + b] << 7));
      float part = 0.0f;
      for (long j = 0; j < 16; ++j) {
        const std::uint8_t byte = pk[r * (k / 2) + b * 16 + j];
        part += kE2M1[byte & 0xF] * bf16_to_float(xb[b * 32 + 2 * j]);
        part += kE2M1[byte >> 4] * bf16_to_float(xb[b * 32 + 2 * j + 1]);
      }
      acc += part * scale;
    }
    yf[r] = acc;
  }
  FILE* out = std::fopen((dir + "/y.bin").c_str(), "wb");
  if (!out || std::fwrite(yf, 4, n, out) != static_cast<std::size_t>(n)) return 3;
  std::fclose(out);
  free(packed);
  free(scales);
  free(x);
  free(y);
  std::printf("gemv.n=%ld\ngemv.k=%ld\ngemv.live_after=%d\n", n, k, static_cast<int>(ktwin::live_aligned_blocks()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "pool") return check_pool();
  if (cmd == "numa") return check_numa();
  if (cmd == "alloc") return check_alloc();
  if (cmd == "amx") return check_amx();
  if (cmd == "variant") return check_variant();
  if (cmd == "gemv" && argc > 2) return check_gemv(argv[2]);
  if (cmd == "posix") return run_posix_surface();
  std::fprintf(stderr, "usage: ktwin_checks pool|numa|alloc|amx|variant|gemv DIR|posix\n");
  return 2;
}
