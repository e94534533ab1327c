#!/usr/bin/env python3
"""make_dummy_gguf.py: a GGUF file of random weights with the shapes of one of
kiln's built-in configs (configs/*.json), for timing llama.cpp's llama-bench
against `kiln bench --profile pp-tg --dummy NAME` on the same model shape and
weight format. The weights are random (normal, std 0.02; norms 1), written by
llama.cpp's own Python writer (pip install gguf numpy); there is no
tokenizer (tokenizer.ggml.model = "none" with the vocabulary size), which is
all llama-bench needs: it feeds random token ids itself.

  python3 tools/make_dummy_gguf.py configs/qwen3-0.6b.json bf16 /tmp/qwen3-0.6b-bf16.gguf
  python3 tools/make_dummy_gguf.py configs/qwen3-0.6b.json q4_0 /tmp/q-0.6b-q4_0-bf16head.gguf --head bf16
  python3 tools/make_dummy_gguf.py moe-8-layers.json q4_0 /tmp/moe8-q4_0.gguf   (a qwen3_moe config.json)
  formats: bf16, f16, f32, q8_0, q4_0 (quantized by gguf.quants, as llama.cpp does)

--random-codes (q4_0, q8_0) writes blocks of uniform random codes with
scales near that spread (as kiln's --dummy does) instead of quantizing
normals: an 8B file in seconds rather than minutes.

--head F writes the token embedding and the output matrix (token_embd.weight,
output.weight when untied) in F instead, and the layers' matrices in the
main format: the layout `llama-quantize --token-embedding-type F
--output-tensor-type F` gives, and the one of a GPTQ checkpoint, whose
embedding / lm_head stay 16-bit. Without it every matrix is in the main format.

Qwen3 dense (qwen3 in llama.cpp's names) and Qwen3-MoE (qwen3moe: the
router in f32 as llama.cpp's converter writes it, the experts as three
[experts, rows, cols] tensors in the main format) are written.
"""
import json
import sys

import numpy as np

import gguf

FORMATS = {
    "bf16": gguf.GGMLQuantizationType.BF16,
    "f16": gguf.GGMLQuantizationType.F16,
    "f32": gguf.GGMLQuantizationType.F32,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
}


def to_bf16_bits(a):
    """f32 array -> bf16 bit patterns (round to nearest even), as uint16"""
    u = a.astype(np.float32).view(np.uint32)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def tensor_bytes(fmt, rows, cols):
    t = FORMATS[fmt]
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    return rows * (cols // bs) * ts


def random_blocks(fmt, rng, rows, cols):
    """Q4_0 / Q8_0 blocks of uniform random codes and f16 scales near the
    spread of std 0.02 (what kiln's --dummy writes), without quantizing
    normals: ~100x faster for 8B-sized files"""
    nb = cols // 32
    if fmt == "q4_0":
        d = (0.02 * 1.7320508 / 8) * (0.75 + 0.5 * rng.random((rows, nb, 1), dtype=np.float32))
        codes = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    else:
        d = (0.02 * 1.7320508 / 128) * (0.75 + 0.5 * rng.random((rows, nb, 1), dtype=np.float32))
        codes = rng.integers(-127, 128, (rows, nb, 32), dtype=np.int8).view(np.uint8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), codes], axis=2).reshape(rows, -1)


def encode(fmt, a):
    """2-D f32 array (rows, cols) -> the array GGUFWriter stores for fmt"""
    if fmt == "bf16":
        return to_bf16_bits(a)
    if fmt == "f16":
        return a.astype(np.float16)
    if fmt == "f32":
        return a.astype(np.float32)
    return gguf.quants.quantize(a.astype(np.float32), FORMATS[fmt])


def main():
    args = sys.argv[1:]
    head = None
    fast = "--random-codes" in args
    if fast:
        args.remove("--random-codes")
    if "--head" in args:
        i = args.index("--head")
        head = args[i + 1] if i + 1 < len(args) else None
        del args[i:i + 2]
        if head not in FORMATS:
            sys.exit(__doc__)
    if len(args) != 3 or args[1] not in FORMATS:
        sys.exit(__doc__)
    cfg = json.load(open(args[0]))
    fmt, out = args[1], args[2]
    mt = cfg.get("model_type")
    if mt not in ("qwen3", "qwen3_moe"):
        sys.exit("only model_type qwen3 and qwen3_moe are supported")
    arch = "qwen3moe" if mt == "qwen3_moe" else "qwen3"
    dim, ffn, nl = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    moe = mt == "qwen3_moe"
    if moe:
        ne, nu, effn = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            sys.exit("only MoE configs whose every layer is sparse are supported")
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", dim // nh)
    vocab = cfg["vocab_size"]
    tied = cfg.get("tie_word_embeddings", False)
    rng = np.random.default_rng(0)

    w = gguf.GGUFWriter(out, arch)
    w.add_name("kiln dummy " + args[0] + (" head " + head if head else ""))
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(dim)
    w.add_block_count(nl)
    w.add_feed_forward_length(ffn)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 1000000)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_uint32(gguf.Keys.LLM.VOCAB_SIZE.format(arch=arch), vocab)
    if moe:
        w.add_expert_count(ne)
        w.add_expert_used_count(nu)
        w.add_expert_feed_forward_length(effn)
    w.add_tokenizer_model("none")
    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[fmt]
    w.add_file_type(ftype)

    # (name, rows, cols, kind[, experts]): kind "mat" in fmt, "head" in head
    # (or fmt), "norm" and "f32" (the router) in f32; experts: a 3-d tensor
    # of that many [rows, cols] matrices
    tensors = [("token_embd.weight", vocab, dim, "head")]
    for i in range(nl):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", 1, dim, "norm"),
            (p + "attn_q.weight", nh * hd, dim, "mat"),
            (p + "attn_k.weight", nkv * hd, dim, "mat"),
            (p + "attn_v.weight", nkv * hd, dim, "mat"),
            (p + "attn_output.weight", dim, nh * hd, "mat"),
            (p + "attn_q_norm.weight", 1, hd, "norm"),
            (p + "attn_k_norm.weight", 1, hd, "norm"),
            (p + "ffn_norm.weight", 1, dim, "norm"),
        ]
        if moe:
            tensors += [
                (p + "ffn_gate_inp.weight", ne, dim, "f32"),
                (p + "ffn_gate_exps.weight", effn, dim, "mat", ne),
                (p + "ffn_up_exps.weight", effn, dim, "mat", ne),
                (p + "ffn_down_exps.weight", dim, effn, "mat", ne),
            ]
        else:
            tensors += [
                (p + "ffn_gate.weight", ffn, dim, "mat"),
                (p + "ffn_up.weight", ffn, dim, "mat"),
                (p + "ffn_down.weight", dim, ffn, "mat"),
            ]
    tensors.append(("output_norm.weight", 1, dim, "norm"))
    if not tied:
        tensors.append(("output.weight", vocab, dim, "head"))

    # header first, then the data tensor by tensor (never all in memory)
    def fmt_of(kind):
        return "f32" if kind == "f32" else head if kind == "head" and head else fmt

    for name, rows, cols, kind, *ex in tensors:
        if kind == "norm":
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
        else:
            f, e = fmt_of(kind), ex[0] if ex else 1
            nb = tensor_bytes(f, rows, cols)
            dt = {"bf16": np.uint16, "f16": np.float16, "f32": np.float32}.get(f, np.uint8)
            shape = (rows, cols) if f in ("bf16", "f16", "f32") else (rows, nb // rows)
            w.add_tensor_info(name, ((e,) if ex else ()) + shape, np.dtype(dt), nb * e, raw_dtype=FORMATS[f])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, rows, cols, kind, *ex in tensors:
        if kind == "norm":
            w.write_tensor_data(np.ones(cols, dtype=np.float32))
        else:
            # in slices of rows so the f32 staging stays small; experts one
            # after another, as rows of one [experts x rows, cols] matrix
            rows_all = rows * (ex[0] if ex else 1)
            step = max(1, (1 << 24) // cols)
            parts = []
            for r0 in range(0, rows_all, step):
                nr = min(step, rows_all - r0)
                if fast and fmt_of(kind) in ("q4_0", "q8_0"):
                    parts.append(random_blocks(fmt_of(kind), rng, nr, cols))
                    continue
                a = rng.standard_normal((nr, cols), dtype=np.float32) * 0.02
                parts.append(encode(fmt_of(kind), a))
            data = np.concatenate(parts, axis=0)
            w.write_tensor_data(data.reshape((ex[0], rows) + data.shape[1:]) if ex else data)
    w.close()
    sys.stderr.write(f"wrote {out}\n")


if __name__ == "__main__":
    main()
