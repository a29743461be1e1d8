/* Stand-in for <pthread.h> under clang-cl/MSVC (there is none): only thread naming, which
 * kt-kernel applies to std::thread::native_handle(). MSVC's STL returns a HANDLE there, so
 * pthread_t is a HANDLE too. NOT on the include path of mingw builds: libstdc++'s std::thread
 * needs winpthreads' real <pthread.h>, and ktwin_compat.h maps naming onto ktwin instead. */
#pragma once
#include <stddef.h>
typedef void* pthread_t;
#ifdef __cplusplus
extern "C" {
#endif
pthread_t pthread_self(void);
int pthread_setname_np(pthread_t thread, const char* name);
int pthread_getname_np(pthread_t thread, char* name, size_t len);
#ifdef __cplusplus
}
#endif
