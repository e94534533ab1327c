/*
 * mlp_overlap.cu: does Qwen3-8B's feed-forward at 8,192 rows get faster
 * when its memory-bound SwiGLU runs beside the next rows' GEMMs instead of
 * between them? At the 700 W limit the GEMMs set the clock; the SwiGLU
 * (604 MB moved, ~136 us per layer) draws little power, so hidden behind a
 * GEMM it might cost nearly nothing. The rows are cut into C chunks; chunk
 * i's gate / up GEMMs, SwiGLU and down GEMM (residual added by beta = 1)
 * run in that order, and in the pipelined variant the GEMMs go on one
 * stream in the order G0 G1 D0 G2 D1 ... while each chunk's SwiGLU runs on a
 * second (high-priority) stream between its G and its D, so SwiGLU i
 * overlaps G i+1. Every variant is timed sustained (card heated first).
 *
 *   nvcc -O2 -std=c++20 -arch=sm_90a -o /tmp/mlp_overlap tools/mlp_overlap.cu -lcublas
 *   /tmp/mlp_overlap [ROWS] [SECS]
 */
#include <cstdio>
#include <cstdlib>
#include <cublas_v2.h>

#include "gpu_bench.cuh"
#include "../src/backend/cuda/swiglu.cuh"

/* out = silu(g) * u over 8-element chunks; grid-stride so the pipelined
 * variant can cap how many SMs it takes */
__global__ void k_swiglu8(bf16 *out, const bf16 *g, const bf16 *u, size_t n8) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x)
        ((uint4 *)out)[i] = swiglu_chunk8(((const uint4 *)g)[i], ((const uint4 *)u)[i]);
}

static const int D = 4096, F = 12288;
static int n;
static cublasHandle_t blas;
static bf16 *x, *xb, *G, *U, *Wg, *Wu, *Wd;
static cudaStream_t s_lo, s_hi;
static cudaEvent_t e_gu[64], e_s[64];

/* out[rows][N] (+)= in[rows][K] W^T on stream s */
static void gemm(cudaStream_t s, const bf16 *W, const bf16 *in, bf16 *out, int rows, int N, int K, float beta) {
    const float one = 1;
    cublasSetStream(blas, s);
    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, rows, K, &one, W, CUDA_R_16BF, K, in, CUDA_R_16BF, K, &beta, out,
                 CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
static void swiglu(cudaStream_t s, size_t r0, int rows, int blocks) {
    size_t n8 = (size_t)rows * F / 8, off = r0 * F;
    unsigned g = blocks ? (unsigned)blocks : (unsigned)((n8 + 255) / 256);
    k_swiglu8<<<g, 256, 0, s>>>(G + off, G + off, U + off, n8);
}
static void gu(cudaStream_t s, int i, int rc) {
    gemm(s, Wg, xb + (size_t)i * rc * D, G + (size_t)i * rc * F, rc, F, D, 0.f);
    gemm(s, Wu, xb + (size_t)i * rc * D, U + (size_t)i * rc * F, rc, F, D, 0.f);
}
static void down(cudaStream_t s, int i, int rc) { gemm(s, Wd, G + (size_t)i * rc * F, x + (size_t)i * rc * D, rc, D, F, 1.f); }

/* one stream, chunk after chunk */
static void mlp_seq(int C) {
    int rc = n / C;
    for (int i = 0; i < C; i++) gu(s_lo, i, rc), swiglu(s_lo, (size_t)i * rc, rc, 0), down(s_lo, i, rc);
}
/* GEMMs on s_lo in the order G0 G1 D0 G2 D1 ..., SwiGLU i on s_hi between
 * G i and D i */
static void mlp_pipe(int C, int blocks) {
    int rc = n / C;
    for (int i = 0; i <= C; i++) {
        if (i < C) {
            gu(s_lo, i, rc);
            cudaEventRecord(e_gu[i], s_lo);
            cudaStreamWaitEvent(s_hi, e_gu[i], 0);
            swiglu(s_hi, (size_t)i * rc, rc, blocks);
            cudaEventRecord(e_s[i], s_hi);
        }
        if (i > 0) {
            cudaStreamWaitEvent(s_lo, e_s[i - 1], 0);
            down(s_lo, i - 1, rc);
        }
    }
}

int main(int argc, char **argv) {
    n = argc > 1 ? atoi(argv[1]) : 8192;
    double secs = argc > 2 ? atof(argv[2]) : 2.0;
    nvml_open();
    cublasCreate(&blas);
    void *ws;
    cudaMalloc(&ws, 64 << 20);
    cublasSetWorkspace(blas, ws, 64 << 20);
    int lo, hi;
    cudaDeviceGetStreamPriorityRange(&lo, &hi);
    cudaStreamCreateWithPriority(&s_lo, cudaStreamNonBlocking, lo);
    cudaStreamCreateWithPriority(&s_hi, cudaStreamNonBlocking, hi);
    for (int i = 0; i < 64; i++) cudaEventCreateWithFlags(&e_gu[i], cudaEventDisableTiming), cudaEventCreateWithFlags(&e_s[i], cudaEventDisableTiming);
    x = rnd((size_t)n * D, 1), xb = rnd((size_t)n * D, 2), G = rnd((size_t)n * F, 3), U = rnd((size_t)n * F, 4);
    Wg = rnd((size_t)F * D, 5), Wu = rnd((size_t)F * D, 6), Wd = rnd((size_t)D * F, 7);
    cudaDeviceSynchronize();
    unsigned sm, mw;
    sustain(3.0, s_lo, 4, 1, [] { mlp_seq(1); }, &sm, &mw);
    printf("rows %d, %.1f s per variant; heated: SM %u MHz, %.0f W\n", n, secs, sm, mw / 1e3);
    double fl = 2.0 * n * 3.0 * F * D;
    struct { const char *name; int C, pipe, blocks; } V[] = {
        {"seq C=1", 1, 0, 0},   {"seq C=2", 2, 0, 0},   {"seq C=4", 4, 0, 0},   {"pipe C=2", 2, 1, 0},
        {"pipe C=4", 4, 1, 0},  {"pipe C=8", 8, 1, 0},  {"pipe C=4 b=66", 4, 1, 66}, {"pipe C=4 b=132", 4, 1, 132},
        {"pipe C=8 b=66", 8, 1, 66},
    };
    for (int r = 0; r < 2; r++)
        for (auto &v : V) {
            double t = sustain(secs, s_lo, 4, 1, [&] { v.pipe ? mlp_pipe(v.C, v.blocks) : mlp_seq(v.C); }, &sm, &mw);
            printf("%-16s %8.1f us per MLP  %4.0f TF/s (GEMMs)  SM %u MHz %.0f W\n", v.name, t, fl / t / 1e6, sm, mw / 1e3);
        }
    /* the parts alone, cold clocks aside: what the sequence would be */
    double tg = sustain(secs, s_lo, 4, 1, [] { gu(s_lo, 0, n); }, &sm, &mw);
    printf("gate+up alone  %8.1f us  SM %u MHz %.0f W\n", tg, sm, mw / 1e3);
    double ts = sustain(secs, s_lo, 4, 1, [] { swiglu(s_lo, 0, n, 0); }, &sm, &mw);
    printf("swiglu alone   %8.1f us  SM %u MHz %.0f W\n", ts, sm, mw / 1e3);
    double td = sustain(secs, s_lo, 4, 1, [] { down(s_lo, 0, n); }, &sm, &mw);
    printf("down alone     %8.1f us  SM %u MHz %.0f W\n", td, sm, mw / 1e3);
    cudaError_t e = cudaDeviceSynchronize();
    printf("sync %s\n", cudaGetErrorString(e));
}
