/* Stand-in for libnuma's <numaif.h> on Windows: memory-policy calls succeed as no-ops (one NUMA
 * node after the fallback; see numa.h). Constants have Linux's values. */
#pragma once

#define MPOL_DEFAULT 0
#define MPOL_PREFERRED 1
#define MPOL_BIND 2
#define MPOL_INTERLEAVE 3
#define MPOL_LOCAL 4
#define MPOL_MF_STRICT (1 << 0)
#define MPOL_MF_MOVE (1 << 1)
#define MPOL_MF_MOVE_ALL (1 << 2)

#ifdef __cplusplus
extern "C" {
#endif
long set_mempolicy(int mode, const unsigned long* nmask, unsigned long maxnode);
long get_mempolicy(int* mode, unsigned long* nmask, unsigned long maxnode, void* addr, unsigned long flags);
long mbind(void* addr, unsigned long len, int mode, const unsigned long* nmask, unsigned long maxnode,
           unsigned flags);
#ifdef __cplusplus
}
#endif
