/* Stand-in for <sys/syscall.h> on Windows: the Linux x86-64 numbers of the calls the compat
 * syscall() understands (see unistd.h). */
#pragma once
#define SYS_arch_prctl 158
#define SYS_gettid 186
#define SYS_getcpu 309
