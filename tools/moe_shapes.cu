/*
 * moe_shapes.cu: times the expert GEMMs of one Qwen3-30B-A3B MoE layer in
 * prefill (128 experts, top-8, expert FFN 768, hidden 2,048) on random bf16
 * data, for 8,192 to 128 tokens, with the routed rows spread over the
 * experts evenly (a hash) or skewed (expert e drawn with weight 1/(e+1)^0.7),
 * in the forms a grouped MoE can take:
 *
 *   grouped  what moe.cu does: cublasGemmGroupedBatchedEx, one problem per
 *            expert with rows (gate and up in one call, down in a second)
 *   loop     three cublasGemmEx per expert with rows
 *   chunkT   each expert's rows padded to a multiple of T rows and cut into
 *            T-row chunks, all chunks one shape: cublasGemmBatchedEx with a
 *            pointer per chunk (gate and up one call, down a second);
 *            "wide" stacks each expert's gate and up weights (N = 1,536)
 *   dense    one GEMM over all routed rows with one expert's weights: the
 *            same FLOPs without any grouping, a floor
 *
 * Prints µs per layer (gate + up + down) and TFLOP/s over the real rows.
 *
 *   nvcc -O2 -std=c++20 -arch=sm_90a -o /tmp/moe_shapes tools/moe_shapes.cu -lcublas && /tmp/moe_shapes
 */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cublas_v2.h>
#include <vector>

#include "gpu_bench.cuh"

static unsigned hash(unsigned i) {
    i = i * 2654435761u ^ 0x9e3779b9u;
    i ^= i >> 13, i *= 0x5bd1e995, i ^= i >> 15;
    return i;
}

int main() {
    const int E = 128, K = 8, F = 768, D = 2048;
    cublasHandle_t h;
    cublasCreate(&h);
    const float one = 1, zero = 0;
    /* weights: per expert [gate | up] stacked (2F x D), down (D x F) */
    bf16 *wgu = rnd((size_t)E * 2 * F * D, 1), *wd = rnd((size_t)E * D * F, 2);
    const int maxr = 8192 * K + E * 256;
    std::vector<void *> hp(9 * (maxr / 32 + E));
    bf16 *xg = rnd((size_t)maxr * D, 3), *hh = rnd((size_t)maxr * 2 * F, 4), *y = rnd((size_t)maxr * D, 5);
    void **dp;
    cudaMalloc(&dp, sizeof(void *) * 9 * (maxr / 32 + E));
    for (int n : {8192, 4096, 2048, 1024, 512, 256, 128})
        for (int skew = 0; skew < 2; skew++) {
            const int R = n * K;
            std::vector<int> cnt(E, 0);
            std::vector<double> cw(E);
            double tot = 0;
            for (int e = 0; e < E; e++) tot += skew ? pow(e + 1.0, -0.7) : 1.0, cw[e] = tot;
            for (int r = 0; r < R; r++) {
                double u = (hash(r) & 0xffffff) / 16777216.0 * tot;
                int e = 0;
                while (e < E - 1 && cw[e] <= u) e++;
                cnt[e]++;
            }
            int mx = 0, used = 0;
            for (int e = 0; e < E; e++) mx = cnt[e] > mx ? cnt[e] : mx, used += cnt[e] > 0;
            std::vector<int> off(E + 1, 0);
            for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
            const double fl = 2.0 * R * 3.0 * F * D;
            printf("tokens %d, %s: rows %d, experts with rows %d, most rows %d (mean %d)\n", n, skew ? "skewed" : "even", R, used, mx, R / E);

            /* grouped, as moe.cu */
            int g = 0;
            std::vector<int> rows;
            for (int e = 0; e < E; e++)
                if (cnt[e]) {
                    hp[g] = wgu + (size_t)e * 2 * F * D;
                    rows.push_back(cnt[e]);
                    g++;
                }
            {
                int q = 0;
                for (int e = 0; e < E; e++)
                    if (cnt[e]) {
                        hp[q] = wgu + (size_t)e * 2 * F * D, hp[g + q] = wgu + (size_t)e * 2 * F * D + (size_t)F * D;
                        hp[2 * g + q] = hp[3 * g + q] = xg + (size_t)off[e] * D;
                        hp[4 * g + q] = hh + (size_t)off[e] * 2 * F, hp[5 * g + q] = hh + (size_t)off[e] * 2 * F + (size_t)cnt[e] * F;
                        hp[6 * g + q] = wd + (size_t)e * D * F, hp[7 * g + q] = hh + (size_t)off[e] * 2 * F, hp[8 * g + q] = y + (size_t)off[e] * D;
                        q++;
                    }
            }
            cudaMemcpy(dp, hp.data(), sizeof(void *) * 9 * g, cudaMemcpyHostToDevice);
            std::vector<int> m(2 * g), nn(2 * g), kk(2 * g), lda(2 * g), ldc(2 * g), gs(2 * g, 1), m2(g), k2(g), l2(g), c2(g);
            std::vector<cublasOperation_t> ta(2 * g, CUBLAS_OP_T), tb(2 * g, CUBLAS_OP_N);
            std::vector<float> al(2 * g, 1.f), be(2 * g, 0.f);
            for (int p = 0; p < 2 * g; p++) m[p] = F, nn[p] = rows[p % g], kk[p] = D, lda[p] = D, ldc[p] = F;
            for (int p = 0; p < g; p++) m2[p] = D, k2[p] = F, l2[p] = F, c2[p] = D;
            cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
            float tg = timeit(20, [&] {
                st = cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), m.data(), nn.data(), kk.data(), al.data(), (const void **)dp, CUDA_R_16BF, lda.data(),
                                                (const void **)dp + 2 * g, CUDA_R_16BF, lda.data(), be.data(), dp + 4 * g, CUDA_R_16BF, ldc.data(), 2 * g, gs.data(),
                                                CUBLAS_COMPUTE_32F);
                cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), m2.data(), nn.data(), k2.data(), al.data(), (const void **)dp + 6 * g, CUDA_R_16BF, l2.data(),
                                           (const void **)dp + 7 * g, CUDA_R_16BF, l2.data(), be.data(), dp + 8 * g, CUDA_R_16BF, c2.data(), g, gs.data(),
                                           CUBLAS_COMPUTE_32F);
            });
            printf("  grouped   %8.1f us %4.0f TF/s (st %d)\n", tg, fl / tg / 1e6, (int)st);

            auto ge = [&](bf16 *out, const bf16 *w, int N, int rr, int Kd, const bf16 *x) {
                cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, rr, Kd, &one, w, CUDA_R_16BF, Kd, x, CUDA_R_16BF, Kd, &zero, out, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT);
            };
            float tl = timeit(5, [&] {
                for (int e = 0; e < E; e++)
                    if (cnt[e]) {
                        const bf16 *wg = wgu + (size_t)e * 2 * F * D;
                        ge(hh + (size_t)off[e] * F, wg, F, cnt[e], D, xg + (size_t)off[e] * D);
                        ge(hh + (size_t)(R + off[e]) * F, wg + (size_t)F * D, F, cnt[e], D, xg + (size_t)off[e] * D);
                    }
                for (int e = 0; e < E; e++)
                    if (cnt[e]) ge(y + (size_t)off[e] * D, wd + (size_t)e * D * F, D, cnt[e], F, hh + (size_t)off[e] * F);
            });
            printf("  loop      %8.1f us %4.0f TF/s\n", tl, fl / tl / 1e6);

            for (int T : {32, 64, 128, 256})
                for (int wide = 0; wide < 2; wide++) {
                    /* padded layout: expert e's rows from po[e], a multiple of T */
                    std::vector<int> po(E + 1, 0);
                    for (int e = 0; e < E; e++) po[e + 1] = po[e] + (cnt[e] + T - 1) / T * T;
                    const int nc = po[E] / T;
                    /* table: gate/up [A | B | C] of 2nc (wide: nc), down [A | B | C] of nc */
                    const int na = wide ? nc : 2 * nc;
                    void **A = hp.data(), **B = A + na, **C = B + na, **A2 = C + na, **B2 = A2 + nc, **C2 = B2 + nc;
                    int c = 0;
                    for (int e = 0; e < E; e++)
                        for (int r = po[e]; r < po[e + 1]; r += T, c++) {
                            const bf16 *wg = wgu + (size_t)e * 2 * F * D;
                            if (wide) {
                                A[c] = (void *)wg, B[c] = xg + (size_t)r * D, C[c] = hh + (size_t)r * 2 * F;
                                B2[c] = hh + (size_t)r * 2 * F; /* down reads gate's half (ld 2F) */
                            } else {
                                A[c] = (void *)wg, A[nc + c] = (void *)(wg + (size_t)F * D);
                                B[c] = B[nc + c] = xg + (size_t)r * D;
                                C[c] = hh + (size_t)r * F, C[nc + c] = hh + (size_t)(po[E] + r) * F;
                                B2[c] = hh + (size_t)r * F;
                            }
                            A2[c] = wd + (size_t)e * D * F, C2[c] = y + (size_t)r * D;
                        }
                    cudaMemcpy(dp, hp.data(), sizeof(void *) * (3 * na + 3 * nc), cudaMemcpyHostToDevice);
                    void **dA = dp, **dB = dA + na, **dC = dB + na, **dA2 = dC + na, **dB2 = dA2 + nc, **dC2 = dB2 + nc;
                    const int ldh = wide ? 2 * F : F;
                    cublasStatus_t s1 = CUBLAS_STATUS_SUCCESS, s2 = s1;
                    float tc = timeit(20, [&] {
                        s1 = cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, wide ? 2 * F : F, T, D, &one, (const void **)dA, CUDA_R_16BF, D, (const void **)dB,
                                                 CUDA_R_16BF, D, &zero, dC, CUDA_R_16BF, ldh, na, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                        s2 = cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, D, T, F, &one, (const void **)dA2, CUDA_R_16BF, F, (const void **)dB2, CUDA_R_16BF,
                                                 ldh, &zero, dC2, CUDA_R_16BF, D, nc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                    });
                    printf("  chunk%-3d%s %8.1f us %4.0f TF/s (padded rows %d, +%.1f%%; st %d %d)\n", T, wide ? "w" : " ", tc, fl / tc / 1e6, po[E],
                           100.0 * (po[E] - R) / R, (int)s1, (int)s2);
                }

            float td = timeit(20, [&] {
                ge(hh, wgu, 2 * F, R, D, xg);
                ge(y, wd, D, R, F, hh);
            });
            printf("  dense     %8.1f us %4.0f TF/s\n", td, fl / td / 1e6);
        }
    cudaError_t e = cudaDeviceSynchronize();
    printf("sync %s\n", cudaGetErrorString(e));
}
