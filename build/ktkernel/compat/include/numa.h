/* Stand-in for libnuma's <numa.h> on Windows (kt-kernel compat layer; see ktwin/ktwin.h).
 * Only the calls kt-kernel makes are declared; topology comes from the Windows NUMA API and falls
 * back to one node holding every CPU when those calls fail. Binding calls are accepted and do
 * nothing: with one node there is nothing to bind, and on multi-node Windows hosts first-touch
 * placement by pinned threads is what remains (see build/README.md). */
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct bitmask {
  unsigned long size; /* number of bits */
  unsigned long* maskp;
};

int numa_available(void);
int numa_max_node(void);
int numa_num_configured_nodes(void);
int numa_num_configured_cpus(void);
int numa_node_of_cpu(int cpu);
struct bitmask* numa_bitmask_alloc(unsigned int nbits);
void numa_bitmask_free(struct bitmask* bmp);
struct bitmask* numa_bitmask_setbit(struct bitmask* bmp, unsigned int n);
struct bitmask* numa_bitmask_clearall(struct bitmask* bmp);
int numa_bitmask_isbitset(const struct bitmask* bmp, unsigned int n);
struct bitmask* numa_allocate_nodemask(void);
void numa_free_nodemask(struct bitmask* bmp);
void numa_bind(struct bitmask* nodes);
void numa_set_membind(struct bitmask* nodes);
void numa_set_preferred(int node);
void numa_set_localalloc(void);
int numa_run_on_node(int node);
void* numa_alloc_onnode(size_t size, int node);
void* numa_alloc_local(size_t size);
void* numa_alloc(size_t size);
void numa_free(void* mem, size_t size);

#ifdef __cplusplus
}
#endif
