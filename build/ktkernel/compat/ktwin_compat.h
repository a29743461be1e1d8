// Force-included into every C++ translation unit of kt-kernel on Windows (clang-cl: /FI, see
// ../cmake/clang-cl-toolchain.cmake), so kt-kernel's sources compile unmodified. It
//  - routes posix_memalign / aligned_alloc / free / realloc (also as std::) to ktwin, so blocks
//    that kt-kernel gets from posix_memalign/std::aligned_alloc can be released by plain free(),
//    which the Windows CRT cannot do (and it has no aligned_alloc at all);
//  - under mingw (the Linux-side proxy build) maps pthread thread naming onto the Windows thread
//    description, as include-msvc/pthread.h does for clang-cl;
//  - includes ktwin/ktwin.h.
// The stand-in headers (numa.h, numaif.h, sched.h, unistd.h, sys/wait.h, sys/syscall.h) are found
// through the include path, not included here. KTWIN_COMPAT_FORCE turns the allocation layer on
// for non-Windows builds of the project's checks, so Linux runs the same code as Windows.
#pragma once
#if defined(__cplusplus) && !defined(KTWIN_BUILDING) && (defined(_WIN32) || defined(KTWIN_COMPAT_FORCE))

// Everything that declares the names below must be seen before the macros rename them.
#include <cstdlib>
#include <stdlib.h>
#if defined(_WIN32)
#include <malloc.h>
#endif
#if defined(__MINGW32__)
#include <pthread.h>
#endif

#include "ktwin/ktwin.h"

extern "C" {
void* ktwin_aligned_alloc(size_t alignment, size_t size);
int ktwin_posix_memalign(void** out, size_t alignment, size_t size);
void ktwin_free(void* p);
void* ktwin_realloc(void* p, size_t size);
#if defined(__MINGW32__)
int ktwin_pthread_setname_np(pthread_t t, const char* name);
int ktwin_pthread_getname_np(pthread_t t, char* name, size_t len);
#endif
}
// `std::free(p)` and `&std::free` become std::ktwin_free after the macros below.
namespace std {
using ::ktwin_aligned_alloc;
using ::ktwin_free;
using ::ktwin_realloc;
}  // namespace std

// Object-like on purpose: `&free` (unique_ptr deleters) must be redirected as well.
#define aligned_alloc ktwin_aligned_alloc
#define posix_memalign ktwin_posix_memalign
#define free ktwin_free
#define realloc ktwin_realloc
#if defined(__MINGW32__)
#define pthread_setname_np ktwin_pthread_setname_np
#define pthread_getname_np ktwin_pthread_getname_np
#endif

#endif
