/*
 * gpu_bench.cuh: what the standalone GPU timing tools share (cublas_shapes,
 * cublas_sustained, mlp_overlap, moe_shapes): random bf16 operands, a wall
 * clock, the SM clock and board power from the driver's NVML library,
 * opened at run time (the toolkit here has no nvml.h), quick back-to-back
 * timing, and timing on a card held at its sustained clock. Header-only:
 * each tool is one nvcc command.
 */
#pragma once
#include <chrono>
#include <cuda_bf16.h>
#include <dlfcn.h>
typedef __nv_bfloat16 bf16;

/* uniform in [-0.05, 0.05) from a hash of the index: random bits, since a
 * power-bound card runs constant data faster */
__global__ void fill(bf16 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995, h ^= h >> 15;
        p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 0.1f);
    }
}
static bf16 *rnd(size_t n, unsigned s) {
    bf16 *p;
    cudaMalloc(&p, n * 2);
    fill<<<1024, 256>>>(p, n, s);
    return p;
}
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static void *nvml_dev;
static int (*nvml_clock)(void *, int, unsigned *), (*nvml_power)(void *, unsigned *);
static void nvml_open() {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) return;
    int (*init)() = (int (*)())dlsym(h, "nvmlInit_v2");
    int (*get)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvml_clock = (int (*)(void *, int, unsigned *))dlsym(h, "nvmlDeviceGetClockInfo");
    nvml_power = (int (*)(void *, unsigned *))dlsym(h, "nvmlDeviceGetPowerUsage");
    if (!init || !get || !nvml_clock || !nvml_power || init() || get(0, &nvml_dev)) nvml_clock = 0;
}
/* SM clock (MHz) and power (mW) now; zeros where NVML is missing */
static void clocks(unsigned *sm, unsigned *mw) {
    *sm = *mw = 0;
    if (nvml_clock) nvml_clock(nvml_dev, 1 /* NVML_CLOCK_SM */, sm), nvml_power(nvml_dev, mw);
}

/* microseconds per call of fn over reps calls after 3 untimed ones, by
 * events on the default stream (not at the sustained clock: for comparing
 * variants run back to back) */
template <class F> static float timeit(int reps, F fn) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int i = 0; i < 3; i++) fn();
    cudaEventRecord(a, 0);
    for (int i = 0; i < reps; i++) fn();
    cudaEventRecord(b, 0);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / reps * 1e3f;
}

/* runs fn in batches of `batch` calls until secs have passed and returns
 * microseconds per call (per: units a call counts as, e.g. the GEMMs of a
 * layer) over the second half, timed by events on stream st (the card is
 * at its sustained clock by then); *sm, *mw: the clock and power at the end */
template <class F> static double sustain(double secs, cudaStream_t st, int batch, int per, F fn, unsigned *sm, unsigned *mw) {
    double t0 = now(), th = t0 + secs / 2;
    while (now() < th) {
        for (int i = 0; i < batch; i++) fn();
        cudaDeviceSynchronize();
    }
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    long calls = 0;
    cudaEventRecord(a, st);
    while (now() < t0 + secs) {
        for (int i = 0; i < batch; i++) fn();
        calls += batch;
        cudaEventRecord(b, st);
        cudaEventSynchronize(b);
    }
    clocks(sm, mw);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms * 1e3 / calls / per;
}
