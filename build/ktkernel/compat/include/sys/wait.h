/* Stand-in for <sys/wait.h> on Windows. kt-kernel only includes it; there is no fork() on Windows,
 * so waitpid() reports "no child" (ECHILD) and the status macros read Linux's encoding. */
#pragma once
#define WNOHANG 1
#define WUNTRACED 2
#define WEXITSTATUS(s) (((s) & 0xff00) >> 8)
#define WTERMSIG(s) ((s) & 0x7f)
#define WIFEXITED(s) (WTERMSIG(s) == 0)
#define WIFSIGNALED(s) (((signed char)(((s) & 0x7f) + 1) >> 1) > 0)
#ifdef __cplusplus
extern "C" {
#endif
int waitpid(int pid, int* status, int options);
#ifdef __cplusplus
}
#endif
