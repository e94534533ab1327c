/*
 * sm90.cuh: Hopper (sm_90) primitives shared by the kernels that stream
 * through shared memory with the copy engine: mbarriers, named barriers,
 * bulk copies. Only for code compiled for sm_90 and up; callers guard.
 */
#ifndef KILN_SM90_CUH
#define KILN_SM90_CUH

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned a, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned a, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT;\n}\n" ::"r"(a),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned a) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
/* arrive, and expect `bytes` more from the copy engine before the phase ends */
__device__ __forceinline__ void mbar_arrive_tx(unsigned a, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
}
/* `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
 * shared memory by the copy engine, completing on mbarrier bar */
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* the same with an L2 eviction policy (createpolicy) */
__device__ __forceinline__ void bulk_load_pol(unsigned dst, const void *src, unsigned bytes, unsigned bar, uint64_t pol) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "l"(pol)
                 : "memory");
}
/* an L2 policy that evicts the lines it touches first */
__device__ __forceinline__ uint64_t pol_evict_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

/* thread-block clusters: a barrier over all threads of the cluster in two
 * halves, for a block that has other work between them (arrive early, wait
 * late); arrive.relaxed orders nothing, wait.acquire sees what was released
 * to the cluster before the arrivals (fence.mbarrier_init below) */
__device__ __forceinline__ void cluster_arrive_relaxed(void) { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait(void) { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
/* the address p (a variable of this block's shared memory) has in block
 * r's shared memory (distributed shared memory) */
__device__ __forceinline__ unsigned dsmem_addr(const void *p, unsigned r) {
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_u32(p)), "r"(r));
    return a;
}
/* mbarrier inits made visible to the cluster: before a relaxed cluster
 * arrive that other blocks wait on before they signal these barriers */
__device__ __forceinline__ void mbar_init_fence_cluster(void) { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
/* wait for the phase of parity to end, the data its transactions brought
 * from other blocks of the cluster visible */
__device__ __forceinline__ void mbar_wait_cluster(unsigned a, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAITC:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAITC;\n}\n" ::"r"(a),
        "r"(parity)
        : "memory");
}
/* *p in block r's shared memory = v without waiting: the store completes 4
 * bytes of the transactions of block r's mbarrier at the address bar has in
 * this block (st.async: no fence or barrier on the sender's side) */
__device__ __forceinline__ void st_async_dsmem(float *p, unsigned r, float v, const void *bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(dsmem_addr(p, r)),
                 "r"(__float_as_uint(v)), "r"(dsmem_addr(bar, r))
                 : "memory");
}
#endif

#endif
