/*
 * cuda.cuh: internals shared by the CUDA backend's files (not a public API).
 *
 * The CUDA backend keeps activations and KV pages in bf16 and accumulates in
 * f32; norm weights, biases and rope frequencies are f32 on the device;
 * linear weights are bf16 (F16/F32 checkpoints are converted once at upload).
 * Everything runs in order on one stream owned by the backend.
 *
 * The batch (struct kiln_batch) is copied to the device once per forward by
 * `begin`, into one buffer laid out as below, so that kernels find tokens,
 * positions, the row -> (sequence, cache slot) map and the page tables
 * without further copies. The offsets depend only on the batch's shape
 * (n_tokens, n_seqs, n_out), which is what lets a captured CUDA graph be
 * replayed for a later decode step of the same shape with new contents:
 *
 *   meta: | tokens[n] | pos[n] | row_seq[n] | row_t[n] | seq[4*S] | out_rows[n_out] | pages[...] | fa[FA_ENT*E] |
 *         seq[4*s+0..3] = start, n, n_past, offset of its page table in pages
 *         row_t[i] = the cache slot (n_past + i) that row i writes and attends up to
 *         fa: the prefill attention work list (only when the flash kernel runs,
 *         i.e. some sequence has more than ATT_ROWS_MAX new rows), E entries of
 *         FA_ENT ints, heaviest first; one k_flash block per (entry, q head):
 *           [0] seq  [1] m0 (first of its 64 query rows)
 *           [2] kb0  [3] kb1: the key blocks (FA_BN keys each) it walks
 *           [4] j0: first partial slot of its split group, -1 when unsplit
 *           [5] sp: its index in the group  [6] n_sp: the group's size
 *           [7] weight (host sort key: keys walked - 64)
 *         An unsplit tile walks [0, ceil(kv_end / 64)), kv_end = n_past +
 *         min(m0 + 64, n); a split tile's n_sp entries cover that range in
 *         consecutive chunks (attention.cu, "split-KV").
 */
#ifndef KILN_CUDA_CUH
#define KILN_CUDA_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/swiglu.cuh"

extern "C" {
#include "backend/backend.h"
#include "base/base.h"
}
#include "backend/cuda/ktrace.cuh"

typedef __nv_bfloat16 bf16;

/*
 * A CUDA or cuBLAS call that failed is recorded, not fatal (cu_dev_fail,
 * cuda.cu): the first failure is logged and the `error` op reports it at
 * the end of the forward, so the batch fails and the process goes on. A
 * sticky error (a kernel that faulted: the context is lost) fails every
 * later batch the same way, and `error` says so. CUDA_FAILED(x) is 1 when
 * x failed, for calls whose failure must stop what follows (a sync before
 * the host reads what came back, a table upload before kernels walk it).
 */
void cu_dev_fail(const char *lib, const char *name, const char *msg, const char *file, int line, const char *call);
static inline int cu_check_rt(cudaError_t e, const char *file, int line, const char *call) {
    if (e == cudaSuccess) return 0;
    cu_dev_fail("CUDA", cudaGetErrorName(e), cudaGetErrorString(e), file, line, call);
    return 1;
}
#define CUDA_FAILED(x) cu_check_rt((x), __FILE__, __LINE__, #x)
/* test hook (kiln_cuda_inject_fault): the next launch asks for 4,096 threads
 * per block, a launch error that leaves the context usable */
extern int cu_inject_launch;
#define CUDA_CHECK(x) ((void)CUDA_FAILED(x))

#define CUBLAS_CHECK(x)                                                                                           \
    do {                                                                                                          \
        cublasStatus_t s_ = (x);                                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                          \
            cu_dev_fail("cuBLAS", cublasGetStatusName(s_), cublasGetStatusString(s_), __FILE__, __LINE__, #x); \
    } while (0)

/* A linear layer's prepared form (qlinear.be). */
struct cu_w4;
struct cu_linear {
    bf16 *w;      /* (n_out, n_in); NULL for 4-bit weights (q4) */
    struct cu_w4 *q4; /* GPTQ / AWQ int4 and Q4_0 kept 4-bit (qgemm.cu), or NULL */
    float *bias;  /* (n_out) or NULL */
    int shared;   /* w belongs to another tensor (the tied embedding) */
    int grouped;  /* w lies inside the allocation of its group's first linear (cu_group_linears): not freed on its own */
};

/* one kind (gate, up or down) of an MoE layer's expert matrices kept 4-bit
 * (moe_w4.cu): every expert's in this layout, or none (on 0) */
struct cu_moe_w4 {
    int on, n_out, n_in, nkb, ng, gsh, sbf;
};

/* Per-MoE-layer device tables of expert weight pointers, built at load
 * (cu_prepare_moe) or on first use. A 4-bit kind's entries are its
 * experts' codes (as bf16 pointers), with their scale words in sc. */
struct cu_moe_tab {
    const void *key;   /* the moe_ffn's host `gate` array */
    int n_expert;
    const bf16 **host; /* what the device arrays hold: gate | up | down, then the 3 kinds' scale words (NULL for bf16), 6 n_expert */
    const bf16 **gate, **up, **down; /* device arrays [n_expert] */
    const uint32_t *const *sc;       /* device: 3 n_expert scale-word pointers */
    struct cu_moe_w4 w4[3];          /* gate, up, down */
};

/* q, k and v's biases (f32, or NULL) for the kernels that read the
 * prefill's one q/k/v GEMM output (cuda_ctx.pqkv) */
struct cu_qkv_bias {
    const float *b[3];
};

/* One captured decode step. */
#define ATT_SPLIT_TOKENS 16

/* attention: sequences with at most ATT_ROWS_MAX new rows take the row
 * kernel; above it the flash kernel (FA_BM query rows x FA_BN-key blocks) */
#define ATT_ROWS_MAX 16
/* ...unless the context is long: from FA_ROWS_MIN_CTX tokens of context a
 * chunk of 2 or more rows takes the flash kernel, which reads each K/V tile
 * once per block of 64 rows and head pair (H200, 8B, 2-16 new tokens after
 * 15,744 cached: 12.6-32.6 ms through the server with the row kernels,
 * 8.3-8.9 ms with flash); KILN_CUDA_FLASH_ROWS_CTX sets it (0: never). From
 * FA_DECODE_MIN_CTX, decode steps of at most FA_DECODE_MAX_SEQS sequences
 * too (eager: the flash work list follows the lengths, so no graph; 8B
 * TPOT at 4,000 / 16,000 tokens 6.99 / 8.55 -> 5.81 / 6.80 ms, 0.6B at
 * 16,000 3.04 -> 2.13 ms); KILN_CUDA_FLASH_DECODE_CTX sets it (0: never).
 * Batches of more sequences keep the row kernels (not measured). */
#define FA_ROWS_MIN_CTX 4096
#define FA_DECODE_MIN_CTX 2048
#define FA_DECODE_MAX_SEQS 4
/* decode steps of at most ATT_DEC_MAX_SEQS sequences with ATT_DEC_MIN_CTX
 * or more keys of context take attn_dec.cu's kernel where the shape and
 * the device allow (sm_90 clusters), the flash and row kernels otherwise */
#define ATT_DEC_MIN_CTX 256
/* (H200, kiln bench --profile batch, 1,024 in, step time with this kernel
 * / the row kernel: 8B 9.12 / 14.58 ms at 16 sequences, 22.76 / 42.16 at 64,
 * 67.8 / 102.1 at 128, 131.2 / 190.4 at 256; 0.6B 2.19 / 4.25, 5.61 /
 * 13.59, 13.7 / 27.5, 25.6 / 49.6): as many as a decode graph holds */
#define ATT_DEC_MAX_SEQS 512
/* ...except above ATT_DEC_MAX_CTX keys with more than 2 query heads per KV
 * head where flash decode takes the step (at most FA_DECODE_MAX_SEQS): its
 * arithmetic per key grows with the group, the tensor cores' does not
 * (H200, tg64 after 16,384 keys: 8B 150 tok/s against flash's 160, 30B-A3B
 * 189 against 210; 0.6B, 2 heads per group, 626 against 541) */
#define ATT_DEC_MAX_CTX 8192
#define FA_BM 64
#define FA_BN 64
#define FA_ENT 8
/* two q heads per flash block only when the longest tile walks this many
 * key blocks (2,048 keys) */
#define FA_HG_MIN_KB 32
/* the same where the two heads run on the wgmma kernel (flash_wg.cu): 512
 * keys (H200, 0.6B pp1024 218k -> 253k tok/s, 8B 38.2k -> 39.6k) */
#define FA_WG_HG_MIN_KB 8
/* k_flash_wg2 overlaps each warpgroup's softmax with its own P V product
 * (flash_wg.cu) where the longest tile walks this many key blocks (2,048
 * keys); below, the prologue costs more than the overlap saves (H200,
 * 0.6B pp1024: 287k without, 277k with) */
#define FA_WG_OVL_MIN_KB 32
/* split-KV of the flash kernel (cuda.cu cu_begin plans it, attention.cu
 * describes it): a chunk walks at least FA_SPLIT_MIN_KB key blocks (512
 * keys), a tile is cut into at most FA_SPLIT_MAX chunks */
#define FA_SPLIT_MIN_KB 8
#define FA_SPLIT_MAX 64
/* the MoE shapes the kernels take (moe.cu, gemm.cu), checked at load
 * (cuda.cu cu_check_model): experts routed per token, and experts per
 * layer (k_route holds a token's E keys, probabilities, ranks and 3E
 * expert pointers in shared memory: 36 bytes each) */
#define CU_MOE_MAX_USED 32
#define CU_MOE_MAX_EXPERTS 1024
/* MoE of at most MOE_DIRECT_MAX tokens takes decode's direct path (a GEMV
 * per routed pair), up to MOE_BATCH_MAX the expert-by-expert kernels of
 * moe_batch.cu, above that the grouped GEMMs (moe.cu); defaults of
 * cuda_ctx.moe_direct / moe_batch */
#define MOE_DIRECT_MAX 8
#define MOE_BATCH_MAX 32
/* 4-bit experts (moe_w4.cu): pair by pair up to MOE_W4_PAIRS_MAX tokens,
 * expert by expert up to MOE_W4_BATCH_MAX, above it GEMMs on the codes or
 * the grouped GEMMs on bf16 scratch (cuda_ctx.moe_w4_pairs, moe_w4_batch,
 * moe_w4_gemm). 96: on 30B-A3B (H100, forty-eighth session) the GEMMs on
 * the codes win from ~100 tokens, for prompts and decode batches alike
 * (b128 8,763 -> 9,582 tok/s, pp128 8,993 -> 10,644), and tie at 96 */
#define MOE_W4_PAIRS_MAX 1
#define MOE_W4_BATCH_MAX 96
/* ... and up to MOE_W4_MIXED_MAX where nothing but the bf16 scratch waits
 * above (a kind widened to bf16, or KILN_CUDA_MOE_W4_GEMM=0): the limit
 * before the forty-eighth session, kept for them (cu_moe_w4_most) */
#define MOE_W4_MIXED_MAX 128

struct sk_prog; /* step.cu: a decode step compiled for the persistent kernel */

struct cu_graph {
    int n_tokens, n_seqs, n_out, att_split, ids, seen; /* ids: the step ends with argmax (kiln_batch.out_ids) */
    int att_dec; /* its attention takes attn_dec.cu's kernel */
    const void *kv; /* the k[] array of the cache it attends to */
    cudaGraphExec_t exec;
    struct sk_prog *sk; /* set: the step runs as k_step (step.cu) instead of a graph */
};

/* One op call of a recorded decode step (step.cu compiles the tape): the
 * op's pointers and sizes as it was called; fields by op in cu_sk_rec's callers. */
enum { SKT_EMBED = 1, SKT_NORM, SKT_ADDNORM, SKT_MATMUL, SKT_ROPE, SKT_KVW, SKT_ATT, SKT_SWIGLU, SKT_ADD, SKT_GATHER, SKT_ARGMAX, SKT_OTHER };
struct sk_op {
    int op, n, dim, i0, i1;
    void *a;
    const void *b, *y, *t, *t2, *t3;
    float f;
};

enum { CU_EAGER = 0, CU_CAPTURE, CU_REPLAY };

struct cuda_ctx {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    int n_sm;
    int smem_sm; /* shared memory of one SM for its blocks, bytes */

    /* the batch on the device (layout above) and its host staging copy */
    int *meta, *meta_host;
    size_t meta_cap; /* ints */
    int *d_tokens, *d_pos, *d_row_seq, *d_row_t, *d_seq, *d_out_rows, *d_pages;
    /* host copies of the batch's shape, for launch decisions */
    int n_tokens, n_seqs, n_out, max_seq_n, max_len;
    int use_flash; /* this batch's attention takes the flash kernel (cu_begin: a long chunk, or a short one over a long context) */
    unsigned long gemv_seq; /* cu_launch_seq right after the last GEMV launch (attention.cu: what ran just before) */
    int no_att_pre;         /* KILN_CUDA_ATT_PRE=0: decode attention loads its keys after the wait */
    int att_split_tokens; /* ATT_SPLIT_TOKENS, or KILN_CUDA_ATT_SPLIT_TOKENS */
    int att_split; /* split-K factor of decode attention: the power of two >= max_len / ATT_SPLIT_TOKENS, at most 64 */
    int att_dec;     /* this batch's decode attention may take attn_dec.cu's kernel (cu_begin; the shape decides per call) */
    const int32_t *out_rows_host;
    const struct kiln_seq_view *seqs_host;
    int *fa_tiles, *fa_tiles_host, n_fa_tiles, fa_tiles_cap; /* prefill attention work list (entries, layout above) */
    int fa_slots; /* partial slots of the split entries (0: no tile is split) */
    int fa_heads, fa_hd, fa_hg, fa_nkv; /* q heads, head_dim, most q heads per flash block (1, 2), KV heads of the last attention call, for cu_begin's plan (0: unknown) */
    int fa_hg_run; /* q heads per flash block in this batch (cu_begin: 2 if fa_hg allows and the longest tile is long) */
    int fa_ovl_run; /* k_flash_wg2 with the in-warpgroup overlap in this batch (cu_begin: the longest tile is long) */

    /* scratch: grown on demand, counted as workspace */
    float *att_part;  size_t att_part_cap;  /* split-K partials (row kernel and split flash entries) */
    int *att_cnt;     size_t att_cnt_cap;   /* split-K: blocks done per (row or split group, head), kept zero between launches */
    float *f32buf;    size_t f32buf_cap;    /* read(): bf16 -> f32 */
    bf16 *w4_x;       size_t w4_x_cap;      /* act-order 4-bit matmuls: x with its columns permuted (qgemm.cu) */
    bf16 *w4_deq;     size_t w4_deq_cap;    /* 4-bit prefill: the weight (an MoE layer: its 4-bit experts with rows) dequantized to bf16 for cuBLAS */
    int w4_off;       /* quantized weights all go to bf16 at load (KILN_CUDA_W4=0) */
    int w4_noperm;    /* act-order 4-bit weights go to bf16 at load (an MoE model: moe_w4.cu takes no permutation) */
    int deq_said;     /* the load-time dequantization has been logged */
    void *moe_buf;    size_t moe_buf_cap;   /* MoE routing, gathered rows, expert outputs */
    int *moe_host;    size_t moe_host_cap;  /* pinned: per-expert row counts of the prefill grouping */
    void **moe_ptr_host; size_t moe_ptr_cap; /* pinned: pointer tables of the grouped expert GEMMs */
    int moe_grouped;  /* expert GEMMs of prefill: 1 one grouped cuBLAS call per projection, 0 one call per expert (KILN_CUDA_MOE_GROUPED) */
    int moe_direct;   /* MoE of at most this many tokens: decode's direct path (KILN_CUDA_MOE_DIRECT, default MOE_DIRECT_MAX) */
    int moe_batch;    /* ... above it and up to this many: expert by expert on the device (moe_batch.cu; KILN_CUDA_MOE_BATCH) */
    int moe_w4_pairs; /* 4-bit experts: pair by pair up to this many tokens (moe_w4.cu; KILN_CUDA_MOE_W4_PAIRS, default MOE_W4_PAIRS_MAX) */
    int moe_w4_batch; /* ... expert by expert up to this many (KILN_CUDA_MOE_W4_BATCH, default MOE_W4_BATCH_MAX) */
    int moe_w4_mixed; /* ... or this many without GEMMs on the codes above (KILN_CUDA_MOE_W4_BATCH, default MOE_W4_MIXED_MAX) */
    int moe_w4_gemm;  /* ... above it on the codes (k_moe_w4_gemm) while the routed rows per expert average at most this many (KILN_CUDA_MOE_W4_GEMM, default 96; 0: dequantized always) */
    int moe_w4_gu_warps; /* 4-bit gate/up blocks of this many warps (KILN_CUDA_MOE_W4_GU_WARPS: 8, or 4) */
    int moe_w4_wt;    /* 4-bit down of <= 2,048 columns with a warp per 16-row tile (KILN_CUDA_MOE_W4_WT, default 1; 0: a block per tile) */
    int moe_chunk;    /* expert GEMMs of prefill in chunks of this many rows (moe.cu moe_chunk_rows): -1 by the row count, 0 never (KILN_CUDA_MOE_CHUNK) */

    struct cu_moe_tab *moe_tabs;
    int n_moe_tabs;

    /* CUDA graphs for decode steps */
    struct cu_graph *graphs;
    int n_graphs, mode, cur_graph;
    int no_graphs;

    /* decode matmuls queued until the next non-matmul op (gemm.cu) */
    struct {
        void *out;
        const struct cu_linear *L;
        int n_out;
    } pend[3];
    const bf16 *pend_x;
    int n_pend, pend_n, pend_n_in, no_defer;

    /* a cuBLAS GEMM (prefill, or decode of more than cu_gemv_rows rows) held
     * back until the next op (gemm.cu): when that op is the add_rmsnorm that
     * adds its output into the residual, the GEMM adds into the residual
     * itself (beta = 1) and the norm runs without the add; any other op
     * launches it as asked. KILN_CUDA_GEMM_RES=0 turns this off. */
    struct {
        int on, n, n_out, n_in;
        bf16 *out;
        const bf16 *x, *w;
    } pgemm;
    int no_gemm_res;
    int w4_slice_env; /* KILN_CUDA_W4_SLICE, or -1: the per-format limit of w4_slice_rows */

    /* decode ops held back to be fused into the next launch (KILN_CUDA_FUSE=0
     * turns this off): an RMSNorm (with its residual add) folded into the
     * GEMV that reads it (gemm.cu), a residual add folded into the RMSNorm
     * that follows it, q/k norm + RoPE fused with the KV write (rope.cu) */
    int no_fuse, no_fuse_norm, old_read;
    int no_norm_r; /* KILN_CUDA_NORM_R=0: norms on k_add_rmsnorm only (norm.cu) */
    int no_gemv_b;      /* KILN_CUDA_GEMV_B=0: no bulk-copy GEMV (gemm.cu k_gemv_b) */
    int no_gemv_b_spread; /* KILN_CUDA_GEMV_B_SPREAD=0: k_gemv_b's blocks may pack 3+ per SM */
    int no_moe_pre;     /* KILN_CUDA_MOE_PRE=0: k_moe_down_b issues its weight copies after its wait */
    unsigned long moe_gu_seq; /* cu_launch_seq right after the last k_moe_gate_up launch */
    int no_moe_ld;      /* KILN_CUDA_MOE_LD=0: MoE decode's down GEMV is k_moe_down_b (or k_moe_down), not the register kernel k_moe_down_r */
    int no_moe_bulk;    /* KILN_CUDA_MOE_BULK=0: MoE decode's down GEMV loads its rows itself (k_moe_down, not k_moe_down_b) */
    int moe_ef;         /* MoE decode's expert GEMVs stream their weights with L2 evict_first (KILN_CUDA_MOE_EF=0: not) */
    int no_moe_ptr;     /* KILN_CUDA_MOE_PTR=0: MoE decode's expert GEMVs look their experts up in the tables (moe.cu) */
    int no_att_cluster; /* KILN_CUDA_ATT_CLUSTER=0: decode attention merges its splits in global memory (attention.cu) */
    struct {
        int on, n, dim;
        bf16 *x, *out;
        const bf16 *y;
        const float *w;
        float eps;
    } pnorm;
    struct {
        int on;
        bf16 *x;
        const bf16 *y;
        size_t n;
    } padd;
    struct {
        int on, n_tok, n_head, n_head_kv, hd;
        bf16 *q, *k;
        const float *qw, *kw, *inv_freq;
        float af, eps;
        const bf16 *qi; /* NULL: q and k in place; else their input is pqkv's one GEMM (rows ld apart) */
        int ld;
    } prope;
    /* q/k/v of a prefill as one GEMM over their grouped weights
     * (cu_matmul_multi): the output s holds each row's q | k | v, ld
     * columns; out[] (the op's three buffers) are written only when the
     * rope that reads q and k (and the KV write of v) runs, which reads s
     * instead, or by a split at the next other op (cu_flush).
     * KILN_CUDA_QKV_MERGE=N: up to N rows (0: never) */
    struct {
        int on, n, ld, n_out[3];
        bf16 *out[3];
        bf16 *s;
        struct cu_qkv_bias bias; /* the linears' biases (Qwen2), added where s is read */
    } pqkv;
    int qkv_max;
    bf16 *qkv_buf;
    size_t qkv_buf_cap;
    /* the rope + KV write of a decode layer, held until the attention right
     * after (attention.cu: k_att_rows<HD, true> does all three);
     * KILN_CUDA_FUSE_ATT=0 turns it off */
    struct {
        int on, P;
        bf16 *kc, *vc;
        const bf16 *v;
    } pkv;
    int no_fuse_att;
    int *norm_cnt; /* the folded norm's block counter, kept zero between launches */
    float *gs_slot; /* k_gemv_s: a row piece per (warp, cut row), and per cut row a counter kept zero */
    int *gs_cnt;
    /* the logits' bf16 staging copy in pinned host memory (read) */
    uint16_t *logit_host;
    size_t logit_host_cap; /* bytes, as every pinned buffer's cap (cu_pinned) */
    /* argmax of the out rows: device ids (scratch) and their pinned host copy */
    int *ids_dev, *ids_host;
    size_t ids_dev_cap, ids_host_cap;

    /* the decode step kernel (step.cu): the op tape of a step being recorded, its scratch */
    struct sk_op *tape;
    int n_tape, tape_cap, tape_on, no_sk;
    float *sk_part;
    size_t sk_part_cap;
    unsigned *sk_bar; /* barrier counters, per-head split counters, argmax candidates */

    /* memory accounting (bytes) */
    size_t bytes_weights, bytes_buffers, bytes_ws, bytes_kv; /* kv: set at the first kv_write */
    int logged;
    /* device memory a scratch buffer could not get in this forward (0:
     * none); the ops that needed it skipped their launches and the `error`
     * op reports it, so the batch fails and the process goes on */
    size_t fault_bytes;
    int fault_host; /* ... and it was pinned host memory (cu_pinned) */
    int dev_failed; /* `error` reported a failed CUDA or cuBLAS call (cu_dev_fail) */
    /* the tied embedding, so lm_head shares its upload */
    const void *embed_host;
    bf16 *embed_dev;
};

/* the most tokens a 4-bit MoE layer (kinds k[3]) runs expert by expert,
 * the CUDA graphs' limit too (no host wait): moe_w4_batch when both kinds
 * are 4-bit and the GEMMs on the codes take over above it, else
 * moe_w4_mixed; pairs, where they go further, are host-free as well */
static inline int cu_moe_w4_most(const struct cuda_ctx *c, const struct cu_moe_w4 *k) {
    const int both = k[0].on && k[2].on, most = both && c->moe_w4_gemm > 0 ? c->moe_w4_batch : c->moe_w4_mixed;
    return both && c->moe_w4_pairs > most ? c->moe_w4_pairs : most;
}

static inline struct cuda_ctx *cu_ctx(struct kiln_backend *be) { return (struct cuda_ctx *)be->ctx; }

/* host -> device copy of `bytes`, ordered on the context's stream and
 * finished on return. Every kernel runs on c->stream, a non-blocking
 * stream, which does not wait for the legacy default stream that a plain
 * cudaMemcpy uses; and cudaMemcpy from pageable memory may return before
 * its DMA lands. A kernel reading a freshly uploaded array could see part
 * of it (the F32 reference fixtures on an H200 did: 19-32% logit error). */
static inline cudaError_t cu_h2d(struct cuda_ctx *c, void *d, const void *h, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, c->stream);
    return e == cudaSuccess ? cudaStreamSynchronize(c->stream) : e;
}

/* zeroes device memory on the context's stream (same reason as cu_h2d) */
static inline cudaError_t cu_zero(struct cuda_ctx *c, void *d, size_t bytes) {
    cudaError_t e = cudaMemsetAsync(d, 0, bytes, c->stream);
    return e == cudaSuccess ? cudaStreamSynchronize(c->stream) : e;
}

/* this forward failed for want of `bytes` of device (or, host, pinned host)
 * memory; the first such failure is the one `error` reports */
static inline void cu_fault(struct cuda_ctx *c, size_t bytes, int host) {
    if (!c->fault_bytes) c->fault_bytes = bytes, c->fault_host = host;
}

/* grows a device scratch buffer (old contents dropped); counts workspace.
 * NULL when device memory runs out (recorded in fault_bytes): the caller
 * skips its launch */
void *cu_scratch(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes);
/* the same; with fault 0 a failed allocation is not the batch's failure
 * (the caller has another way: NULL, nothing recorded) */
void *cu_scratch_try(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes, int fault);
/* the split merges' counters (att_cnt), at least n, zeroed when grown (the
 * kernels leave them zeroed); NULL when device memory runs out */
int *cu_att_cnt(struct cuda_ctx *c, size_t n);
/* grows a pinned host buffer to at least `bytes` (cap in bytes; old contents
 * dropped): 0, or -1 when the host cannot pin that much; a caller whose
 * batch fails then records it (cu_fault) and skips its work */
int cu_pinned(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes);
/* count device buffers copied back to back into one new allocation of
 * their bytes plus tail (cuda.cu; stream order, then a sync); NULL when it
 * cannot be made (out of memory is not sticky) */
char *cu_dev_concat(struct cuda_ctx *c, const void *const *src, const size_t *bytes, int count, size_t tail);

/* ops, one family per file */
void cu_matmul(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n);
/* q/k/v: one GEMM where their weights are one allocation (pqkv), else cu_matmul each */
void cu_matmul_multi(struct kiln_backend *be, void *const *outs, const void *x, const struct qlinear *const *ws, int count, int n);
/* out (f32) [n][n_out] = x W^T: the MoE router */
void cu_matmul_f32(struct cuda_ctx *c, float *out, const bf16 *x, const bf16 *w, int n, int n_out, int n_in);
/* out [n][n_out] = x W^T without bias, bf16 out (grouped expert GEMMs) */
void cu_gemm_bf16(struct cuda_ctx *c, bf16 *out, const bf16 *x, const bf16 *w, int n, int n_out, int n_in);
void cu_rmsnorm(struct kiln_backend *be, void *out, const void *x, const struct ktensor *w, int n, int dim, float eps);
void cu_add_rmsnorm(struct kiln_backend *be, void *x, void *out, const void *y, const struct ktensor *w, int n, int dim,
                    float eps);
void cu_qk_norm_rope(struct kiln_backend *be, void *q, void *k, const struct ktensor *qn, const struct ktensor *kn,
                     const struct rope *rope, const struct kiln_batch *b, int n_head, int n_head_kv, int head_dim,
                     float eps);
void cu_kv_write(struct kiln_backend *be, struct kv_cache *kv, int layer, const void *k, const void *v,
                 const struct kiln_batch *b);
void cu_attention(struct kiln_backend *be, void *out, const void *q, const struct kv_cache *kv, int layer,
                  const struct kiln_batch *b, int n_head, float scale);
/* resident blocks per SM of the split flash kernel at head_dim hd (1 if unsupported) */
int cu_flash_blocks_per_sm(int hd, int hg);
int cu_flash_hg(int n_head, int nkv);
/* flash_wg.cu: the wgmma prefill kernel (head_dim 128, two q heads per
 * block) where the sm_90a code runs; KILN_CUDA_FA_WG=0 turns it off */
int cu_flash_wg_ok(void);
void cu_flash_wg_launch(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head,
                        float sl2, float *part, int *cnt);
void cu_moe(struct kiln_backend *be, void *out, const void *x, const struct moe_ffn *m, int n, int dim);
/* decode attention with a KV group's query heads in one block (attn_gqa.cu);
 * 0 when the shape is not one it handles */
int cu_attention_gqa(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head, float sl2);
int cu_attention_gqa_takes(const struct cuda_ctx *c, const struct kv_cache *kv, int n_head);
/* decode attention streamed by the copy engine, the splits merged in a
 * cluster (attn_dec.cu): whether a shape suits it, whether it takes this
 * call, and the launch (0 when it does not take it) */
int cu_att_dec_shape(int hd, int n_head, int nkv);
int cu_att_dec_takes(const struct cuda_ctx *c, const struct kv_cache *kv, int n_head);
int cu_attention_dec(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head, float sl2);
void cu_embed(struct kiln_backend *be, void *x, const struct ktensor *table, const struct kiln_batch *b);
void cu_swiglu(struct kiln_backend *be, void *out, const void *gate, const void *up, int n, int ffn);
void cu_add(struct kiln_backend *be, void *x, const void *y, size_t n);
void cu_gather_rows(struct kiln_backend *be, void *out, const void *x, const int32_t *rows, int n_rows, int dim);
/* swiglu on raw device pointers (MoE) */
void cu_swiglu_raw(struct cuda_ctx *c, bf16 *out, const bf16 *g, const bf16 *u, size_t n);
/* the MoE decode path's fused kernels live in gemm.cu beside the GEMV */
/* selp: the chosen experts' (gate, up, down) pointers per routed pair, from
 * k_route (moe.cu); NULL: look sel up in the tables */
void cu_moe_gate_up(struct cuda_ctx *c, bf16 *h, const bf16 *x, const int *sel, const bf16 *const *selp, const bf16 *const *gate,
                    const bf16 *const *up, int n, int K, int ffn, int dim);
void cu_moe_down(struct cuda_ctx *c, bf16 *out, const bf16 *h, const int *sel, const bf16 *const *selp, const float *wsel,
                 const bf16 *const *down, int n, int K, int ffn, int dim);
/* moe.cu: an MoE layer's expert tables (settled, uploaded on first use); NULL
 * when device memory runs out (recorded by cu_fault) */
const struct cu_moe_tab *cu_moe_table(struct cuda_ctx *c, const struct moe_ffn *m);
/* moe_batch.cu: the MoE FFN of n tokens expert by expert, each used expert
 * read once, no host wait; scratch of cu_moe_batch_scratch bytes */
size_t cu_moe_batch_scratch(int n, int K, int E, int ffn, int dim);
/* pairs: both kinds 4-bit, each routed pair its own expert read (no sort;
 * the 4-bit layers' direct path) */
void cu_moe_batch(struct cuda_ctx *c, bf16 *out, const bf16 *x, const int *sel, const float *wsel, const struct cu_moe_tab *tab,
                  int n, int K, int E, int ffn, int dim, void *scratch, int pairs);

/*
 * Launches go through cu_launch, which marks them for programmatic dependent
 * launch (PDL, sm_90): a kernel's blocks may be scheduled while the previous
 * kernel drains, and wait in pdl_wait() until its results are visible. That
 * hides most of the launch gap between the ~10 small kernels of a decode
 * layer. Every kernel starts with pdl_wait() before reading anything another
 * kernel may still write. Read ahead of the wait: the GEMVs' weights
 * (gemm.cu), and decode attention's batch tables and cached keys when a GEMV
 * was the launch just before it (attention.cu, k_att_rows).
 * pdl_wait() lets the next kernel launch first and then waits: a norm, an
 * attention or a router kernel between two GEMVs releases the second GEMV at
 * its own start, so that GEMV's blocks take SM slots as the first one's
 * retire and put their first weight loads in flight during its drain, not
 * after the small kernel is done. Order still holds: a kernel reads and
 * writes only after its wait, which returns once the kernel before it has
 * finished, which waited for the one before it. The dependent grid starts
 * only when every block of this one has started, so a waiting block never
 * holds a slot that this grid still needs. Measured (H200, tg128,
 * alternated, wait-then-release -> release-then-wait): 8B 214.7 / 213.1 ->
 * 216.5 / 216.2 tok/s, 30B-A3B 330.5 / 333.2 -> 336.9, 0.6B within its
 * spread; `make test-cuda` 1,089 passed. The GEMVs keep wait-then-release
 * (gemm.cu): they release their dependents right after the wait anyway.
 * KILN_CUDA_PDL=0 turns PDL off.
 * A pointer to what an earlier kernel writes must not be `const
 * __restrict__` in a kernel that reads it after pdl_wait(): nvcc takes such
 * a load as invariant for the whole kernel (ld.global.nc) and may move it
 * above the wait, whose "memory" clobber does not hold it back. It did for
 * k_att_rows's q once that load became a single vector load (2026-12-03,
 * found in the SASS: LDG.E.64.CONSTANT before ACQBULK); q is plain const
 * since. Weights and tables are written by no kernel, so theirs may be.
 * tools/cuda/prewait.py lists each kernel's loads before its wait.
 */
extern int cu_pdl;
/* launches so far by this thread (cu_launch counts them): an op can tell
 * what was launched just before it. Per thread, so that backends driven
 * from two threads cannot lose each other's increments and make a launch
 * look like it came right after one it did not (each check only ever turns
 * an early read on when its kernel was the very last launch) */
extern thread_local unsigned long cu_launch_seq;

__device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    KTRACE_WAITED();
}

/* the other order, wait then release (the GEMVs and k_moe_gate_up, gemm.cu):
 * the next kernel starts only once the one before this is done, so it may
 * read that kernel's results before its own wait (attention.cu after a
 * GEMV, k_moe_down_b after gate/up) */
__device__ __forceinline__ void pdl_wait_release(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    KTRACE_WAITED();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* cl: thread-block cluster dimensions (sm_90; (1, 1, 1) for none) */
template <typename... KArgs, typename... Args>
static inline void cu_launch_cl(cudaStream_t s, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, dim3 cl, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cudaLaunchAttribute at[2];
    int na = 0;
    if (cu_pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cl.x * cl.y * cl.z > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = cl.x, at[na].val.clusterDim.y = cl.y, at[na++].val.clusterDim.z = cl.z;
    }
    cfg.attrs = at, cfg.numAttrs = na;
    cu_launch_seq++;
    if (cu_inject_launch) cu_inject_launch = 0, cfg.blockDim = dim3(4096, 1, 1);
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
    if (e != cudaSuccess) {
        char call[160];
        snprintf(call, sizeof call, "a launch: grid (%u, %u, %u), block (%u, %u, %u), cluster (%u, %u, %u), %zu bytes of shared memory",
                 grid.x, grid.y, grid.z, block.x, block.y, block.z, cl.x, cl.y, cl.z, smem);
        cu_dev_fail("CUDA", cudaGetErrorName(e), cudaGetErrorString(e), __FILE__, __LINE__, call);
    }
}

template <typename... KArgs, typename... Args>
static inline void cu_launch(cudaStream_t s, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
    cu_launch_cl(s, k, grid, block, smem, dim3(1, 1, 1), args...);
}

/* the device is sm_90 or newer and kernel k has sm_90 code in this build
 * (the kernels using clusters, bulk copies or mbarriers check this before
 * their first launch) */
int cu_sm90_code(const void *k);
/* the largest cluster (16, a non-portable size, or 8) in which kernel k's
 * blocks of `threads` threads and `smem` bytes of dynamic shared memory can
 * run on this device; 0 for none. Call once k's attributes are set. */
int cu_cluster_max(const void *k, int threads, size_t smem);

/* checks the last launch (cheap; launch errors are bugs or a broken device: recorded, cu_dev_fail) */
#define CU_LAUNCHED() CUDA_CHECK(cudaGetLastError())

/* launches every held-back op (gemm.cu): the queued decode matmuls (with a
 * folded norm), a pending norm, add or rope; every op but matmul calls it first */
void cu_flush(struct cuda_ctx *c);
/* the held GEMM (cuda_ctx.pgemm): into its own output (res == NULL), or
 * added into res (res += x W^T in the GEMM's epilogue, one rounding) */
void cu_pgemm_launch(struct cuda_ctx *c, bf16 *res);
/* the held q/k/v GEMM's output split into the op's three buffers (pqkv) */
void cu_pqkv_split(struct cuda_ctx *c);
/* only the queued matmuls (with their folded norm) */
void cu_flush_mm(struct cuda_ctx *c);
/* the standalone launches behind the held-back ops */
void cu_norm_launch(struct cuda_ctx *c, bf16 *x, bf16 *out, const bf16 *y, const float *w, int n, int dim, float eps);
void cu_add_launch(struct cuda_ctx *c, bf16 *x, const bf16 *y, size_t n);
void cu_rope_launch(struct cuda_ctx *c, bf16 *kc, bf16 *vc, const bf16 *v, int P);
/* the router GEMV (f32 out) of MoE decode, folding in the pending norm when it produced x */
void cu_matmul_f32_norm(struct cuda_ctx *c, float *out, const bf16 *x, const bf16 *w, int n, int n_out, int n_in);
/* the queued gate and up matmuls fused with out = silu(gate) * up; 0 if they do not match */
int cu_swiglu_fused(struct cuda_ctx *c, void *out, const void *gate, const void *up, int n, int ffn);

/* qgemm.cu: 4-bit weights. prepare: 1 when L now holds w in the W4 layout,
 * 0 when w is not a format (or group shape) W4 takes, or is act-order and
 * noperm is set, -1 with err */
int cu_w4_prepare(struct cuda_ctx *c, const struct qlinear *w, struct cu_linear *L, int noperm, char *err, size_t errlen);
void cu_w4_release(struct cuda_ctx *c, struct cu_linear *L);
size_t cu_w4_bytes(const struct cu_linear *L);
/* x, or x with its columns in the act-order permutation (scratch); NULL when out of memory */
const bf16 *cu_w4_x(struct cuda_ctx *c, const struct cu_linear *L, const bf16 *x, int n);
/* out = x W^T + b (x from cu_w4_x): one launch for n <= W4_GEMV_ROWS rows,
 * one per 16-row slice of x past that */
#define W4_GEMV_ROWS 16
/* up to this many rows a 4-bit matmul runs the GEMV on 16-row slices of x
 * rather than cuBLAS on a bf16 copy: 3 slices for groups of more than 64
 * columns, 2 for groups of 32 or 64, whose GEMV is slower (measured, H100,
 * docs/cuda.md); KILN_CUDA_W4_SLICE=N sets one limit for all */
static inline int w4_slice_rows(int env_rows, int gsh) { return env_rows >= 0 ? env_rows : gsh >= 2 ? 48 : 32; }
void cu_w4_gemv(struct cuda_ctx *c, bf16 *out, const bf16 *x, const struct cu_linear *L, int n);
/* one launch of nl <= 3 such matmuls over the same x (GLU: gate and up, out[0] = silu(gate) * up, out[1] = up) */
void cu_w4_gemv_multi(struct cuda_ctx *c, bf16 *const *outs, const struct cu_linear *const *Ls, int nl, int glu, const bf16 *x, int n);
/* the linear's columns are in act-order (x must go through cu_w4_x) */
int cu_w4_permuted(const struct cu_linear *L);
/* log2 of the 32-column chunks per group (w4pack.h's gsh) */
int cu_w4_gsh(const struct cu_linear *L);
/* the weight as bf16 (n_out, n_in) in scratch, for cuBLAS; NULL when out of memory */
const bf16 *cu_w4_dequant(struct cuda_ctx *c, const struct cu_linear *L);
/* the 4-bit linears' codes moved into one allocation and their scale words
 * into another (the first linear owns them), as cu_group_linears does for
 * bf16; anything else, or no memory for the move, stays as it was */
void cu_w4_group(struct cuda_ctx *c, struct cu_linear *const *Ls, int count);
/* L widened to bf16 on the device for good (its 4-bit copy freed): 0, or
 * -1 when device memory runs out (recorded by cu_fault) */
int cu_w4_widen(struct cuda_ctx *c, struct cu_linear *L);

/* moe_w4.cu: MoE experts kept 4-bit. settle: a kind whose experts are not
 * all 4-bit in one layout is widened (0, or -1 out of device memory);
 * kinds: the layer's three kinds as they are now; ptr: w's codes (sc 0) or
 * scale words (sc 1), NULL for a bf16 matrix */
int cu_moe_settle(struct cuda_ctx *c, const struct moe_ffn *m);
void cu_moe_w4_kinds(const struct moe_ffn *m, struct cu_moe_w4 *k);
const void *cu_moe_w4_ptr(const struct qlinear *w, int sc);
/* expert by expert over k_moe_sort's grouping (moe_batch.cu), or with ue
 * NULL pair by pair (slot j = pair j, expert sel[j]; ny = the pairs): h =
 * silu(x gate^T) * (x up^T) per slot, yo = h down^T per slot (f32) */
void cu_moe_w4_gate_up(struct cuda_ctx *c, const struct cu_moe_tab *tab, bf16 *h, const bf16 *x, const int *pslot, const int *ue,
                       const int *uo, const int *uc, const int *nu, const int *sel, int K, unsigned ny);
void cu_moe_w4_down(struct cuda_ctx *c, const struct cu_moe_tab *tab, float *yo, const bf16 *h, const int *ue, const int *uo,
                    const int *uc, const int *nu, const int *sel, unsigned ny);
/* prefill: the 4-bit kinds' experts with rows (dcnt, device) as bf16 in
 * scratch; hw[3 E] = every expert's bf16 gate | up | down for cuBLAS; -1
 * when out of device memory */
int cu_moe_w4_dequant(struct cuda_ctx *c, const struct cu_moe_tab *tab, const int *dcnt, const bf16 **hw);
/* prefill with both kinds 4-bit, on the codes (k_moe_w4_gemm): chunk q of
 * MOE_W4_GEMM_ROWS rows of xg (device tables: its expert dce[q], its first
 * row dcr[q]), hg = silu(xg gate^T) * (xg up^T) (hu: scratch), y = hg
 * down^T; rows: xg's rows (the chunks'); 0, or -1 out of device memory */
#define MOE_W4_GEMM_ROWS 64
int cu_moe_w4_gemm(struct cuda_ctx *c, const struct cu_moe_tab *tab, const int *dce, const int *dcr, int nc, bf16 *xg, bf16 *hg,
                   bf16 *hu, bf16 *y, int rows);

/* step.cu: the persistent decode step kernel */
int cu_sk_enabled(struct cuda_ctx *c);
void cu_sk_rec(struct cuda_ctx *c, int op, void *a, const void *b, const void *y, const void *t, const void *t2, const void *t3,
               int n, int dim, int i0, int i1, float f);
void cu_sk_compile(struct cuda_ctx *c, struct cu_graph *g);
void cu_sk_launch(struct cuda_ctx *c, struct sk_prog *p);
void cu_sk_free(struct sk_prog *p);
void cu_sk_forget_stream(cudaStream_t s);
extern long cu_sk_count;
/* records an op into the tape while a step is being recorded */
#define CU_TAPE(c, ...)                                  \
    do {                                                 \
        if ((c)->tape_on) cu_sk_rec((c), __VA_ARGS__);   \
    } while (0)

/* skip the op when a captured graph will replay it */
#define CU_SKIP_IF_REPLAY(be)                          \
    do {                                               \
        if (cu_ctx(be)->mode == CU_REPLAY) return;     \
    } while (0)

/* the start of every op but matmul: skip under replay, else flush the queue */
#define CU_OP_ENTER(be)                                \
    do {                                               \
        if (cu_ctx(be)->mode == CU_REPLAY) return;     \
        cu_flush(cu_ctx(be));                          \
    } while (0)


/* ==== small device helpers shared by the kernels ==== */

/* sum of v over the warp (every lane gets it) */
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* c += a b on the tensor cores (sm_80+): one m16n8k16 tile, bf16 inputs in
 * mma.sync's fragment layout (a: 4 registers of the 16 x 16 A, b0 b1: the
 * 16 x 8 B), f32 accumulators c[4] */
__device__ __forceinline__ void mma16816(float *c, const unsigned *a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* argmax merge of (value, index) pairs: the larger value wins, the lower
 * index on ties (the host's kiln_argmax on the same bf16-exact values) */
__device__ __forceinline__ void amax_merge(float &m, int &at, float m2, int at2) {
    if (m2 > m || (m2 == m && at2 < at)) m = m2, at = at2;
}

/* sum of v over the block (all threads get it); blockDim.x a multiple of 32 */
__device__ __forceinline__ float cu_block_sum(float v) {
    __shared__ float s[32];
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads(); /* s[] may still be read from a previous call */
    if (l == 0) s[w] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += s[i];
    return t;
}

/* decode attention's split-K merge (blocks of 128 threads): a (row, head)'s
 * n_split <= 64 partials [M, L, o[HD]] into its normalised output, in split
 * order; get(i, j) reads element j of split i (global partials or, in a
 * cluster, another block's shared memory). Used by attention.cu and
 * attn_gqa.cu; a block calling it again syncs first (wsp is rewritten). */
template <int HD, typename G>
__device__ __forceinline__ void att_merge(bf16 *__restrict__ out, int n_split, G get) {
    __shared__ float wsp[64];
    __shared__ float MLs[2];
    if (threadIdx.x < n_split) wsp[threadIdx.x] = get(threadIdx.x, 0);
    __syncthreads();
    if (threadIdx.x == 0) {
        float MM = -INFINITY, LL = 0.f;
        for (int i = 0; i < n_split; i++) MM = fmaxf(MM, wsp[i]);
        MLs[0] = MM;
        for (int i = 0; i < n_split; i++) LL += wsp[i] == -INFINITY ? 0.f : exp2f(wsp[i] - MM) * get(i, 1);
        MLs[1] = LL;
    }
    __syncthreads();
    if (threadIdx.x < n_split) wsp[threadIdx.x] = wsp[threadIdx.x] == -INFINITY ? 0.f : exp2f(wsp[threadIdx.x] - MLs[0]);
    __syncthreads();
    const float invL = 1.f / MLs[1];
    for (int d = threadIdx.x; d < HD; d += 128) {
        float acc = 0.f;
#pragma unroll 8
        for (int i = 0; i < n_split; i++) acc += wsp[i] * get(i, 2 + d);
        out[d] = __float2bfloat16(acc * invL);
    }
}

/* two bf16 packed in a word to f32 */
__device__ __forceinline__ float2 bf2(unsigned u) {
    __nv_bfloat162 h;
    memcpy(&h, &u, 4);
    return __bfloat1622float2(h);
}

/* 8 bf16 (16 bytes) to f32: from a register, from memory (aligned); and
 * back with rounding to nearest */
__device__ __forceinline__ void cu_u4_f8(float *f, uint4 u) {
    const float2 a = bf2(u.x), b = bf2(u.y), c = bf2(u.z), d = bf2(u.w);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}
__device__ __forceinline__ void cu_load8(float *f, const bf16 *p) { cu_u4_f8(f, *(const uint4 *)p); }

__device__ __forceinline__ void cu_store8(bf16 *p, const float *f) {
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *(uint4 *)p = u;
}

/* One warp step of split-K decode attention (attention.cu's row kernel,
 * step.cu's attention stage): the scores of a query (qv: E elements per
 * lane, pre-scaled by log2(e)/sqrt(hd)) against 4 keys kx[u], keys u >=
 * nvalid masked, then the online softmax (m, l) and output o (E per lane)
 * updated with the values vx[u]. */
template <int E>
__device__ __forceinline__ void att_step4(const float *qv, const float (*kx)[E], const float (*vx)[E], int nvalid, float &m,
                                          float &l, float *o) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int e = 0; e < E; e++) d[u] += qv[e] * kx[u][e];
#pragma unroll
    for (int x = 16; x; x >>= 1)
#pragma unroll
        for (int u = 0; u < 4; u++) d[u] += __shfl_xor_sync(0xffffffffu, d[u], x);
#pragma unroll
    for (int u = 0; u < 4; u++)
        if (u >= nvalid) d[u] = -INFINITY;
    const float mn = fmaxf(fmaxf(m, fmaxf(d[0], d[1])), fmaxf(d[2], d[3])), corr = exp2f(m - mn);
    float p[4];
#pragma unroll
    for (int u = 0; u < 4; u++) p[u] = exp2f(d[u] - mn);
    l = l * corr + (p[0] + p[1]) + (p[2] + p[3]);
    m = mn;
#pragma unroll
    for (int e = 0; e < E; e++) o[e] = o[e] * corr + p[0] * vx[0][e] + p[1] * vx[1][e] + p[2] * vx[2][e] + p[3] * vx[3][e];
}

#endif
