/* Stand-in/extension of <unistd.h> on Windows: sysconf, usleep, getpid and syscall() with the one
 * system call kt-kernel makes, arch_prctl for AMX tile permission (answered from XCR0: Windows
 * enables tile state itself). Under mingw its own <unistd.h> comes first. */
#pragma once
#if defined(__MINGW32__)
#include_next <unistd.h>
#else
#include <process.h> /* getpid (UCRT, via oldnames) */
#include <io.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define _SC_NPROCESSORS_CONF 83
#define _SC_NPROCESSORS_ONLN 84
#define _SC_PAGESIZE 30
#define _SC_PAGE_SIZE _SC_PAGESIZE

long sysconf(int name);
long syscall(long number, ...);
#if !defined(__MINGW32__)
int usleep(unsigned int usec);

#endif

#ifdef __cplusplus
}
#endif
