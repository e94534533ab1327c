#!/usr/bin/env python3
"""make_quant_fixtures.py: the quantized-checkpoint fixtures of tests/test_quant.c.

Needs numpy, safetensors and gguf (llama.cpp's own Python writer); no torch.
Writes tests/fixtures/quant/:

  micro/                    a fresh random Qwen3 (1 layer, hidden 64, ffn 128,
                            vocab 320, tied), bf16: the base every variant starts from
  micro-moe/                the same with a 4-expert top-2 MoE layer (Qwen3-MoE)
  <variant>/                the base quantized round-to-nearest into one layout,
                            written as the real releases write it (config.json
                            quantization_config, quantize_config.json for GPTQ)
  <variant>-ref/            the SAME model with every quantized linear replaced by
                            its dequantized weights, F32: kiln's logits on
                            <variant> must equal kiln's logits on <variant>-ref
  gguf/*.gguf               GGUF files written by gguf.GGUFWriter; *-ref folders as
                            above, the dequantization done by gguf.quants.dequantize
                            (llama.cpp's reference, not ours)
  manifest.json             what the C test iterates over

Packing follows the reference code quoted in ../shared/reference/quant-formats.md:
AutoGPTQ pack() (qweight along K, qzeros along N, LSB first, v1 stores z-1),
AutoAWQ (qweight [K, N/8], order [0,2,4,6,1,3,5,7], true zeros), FP8 block
(weight_scale_inv multiplies, partial edge blocks).

Run from the repository root: python3 tools/make_quant_fixtures.py
`--quality-model DIR [--no-outliers]` instead writes the qwen3-0.6b-shaped model of docs/quant.md.
"""
import json, os, shutil, sys
import numpy as np
from safetensors.numpy import save_file, load_file
import gguf
from gguf import GGMLQuantizationType as QT

OUT = "tests/fixtures/quant"
RNG = np.random.default_rng(20240531)


def bf16_round(a):
    a = np.asarray(a, np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def to_bf16_bytes(a):
    """float32 (already bf16-exact) -> uint16 array for safetensors 'BF16'."""
    return (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def save_st(path, tensors):
    """tensors: name -> (np array, dtype string). safetensors.numpy has no
    bfloat16, so BF16/F8 tensors are written by hand."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        arr, dt = tensors[name]
        if dt == "BF16":
            raw = to_bf16_bytes(arr).tobytes()
        else:
            raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- base models

def base_config(moe=False, hidden=64, ffn=128, vocab=128, heads=4, kv=2, head_dim=16, layers=1):
    c = {
        "architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
        "model_type": "qwen3_moe" if moe else "qwen3",
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": ffn,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
        "attention_bias": False, "torch_dtype": "bfloat16", "bos_token_id": None, "eos_token_id": vocab - 3,
    }
    if moe:
        c.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []})
    return c


def realistic(n, k, std=0.05, outliers=True):
    """normal weights with per-row scale variation and a few outlier input columns"""
    w = RNG.standard_normal((n, k)).astype(np.float32) * std
    w *= np.exp(RNG.normal(0, 0.3, (n, 1))).astype(np.float32)
    if outliers:
        cols = RNG.choice(k, max(1, k // 32), replace=False)
        w[:, cols] *= 4
    return bf16_round(w)


def make_base(cfg):
    t = {}
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    qd, kvd = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    t["model.embed_tokens.weight"] = bf16_round(RNG.standard_normal((V, H)) * 0.5)
    t["model.norm.weight"] = bf16_round(1 + 0.1 * RNG.standard_normal(H))
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = bf16_round(1 + 0.1 * RNG.standard_normal(H))
        t[p + "post_attention_layernorm.weight"] = bf16_round(1 + 0.1 * RNG.standard_normal(H))
        t[p + "self_attn.q_norm.weight"] = bf16_round(1 + 0.1 * RNG.standard_normal(cfg["head_dim"]))
        t[p + "self_attn.k_norm.weight"] = bf16_round(1 + 0.1 * RNG.standard_normal(cfg["head_dim"]))
        t[p + "self_attn.q_proj.weight"] = realistic(qd, H, 0.15)
        t[p + "self_attn.k_proj.weight"] = realistic(kvd, H, 0.15)
        t[p + "self_attn.v_proj.weight"] = realistic(kvd, H, 0.15)
        t[p + "self_attn.o_proj.weight"] = realistic(H, qd, 0.15)
        if "num_experts" in cfg:
            E, MF = cfg["num_experts"], cfg["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = realistic(E, H, 0.2)
            for e in range(E):
                t[p + f"mlp.experts.{e}.gate_proj.weight"] = realistic(MF, H, 0.15)
                t[p + f"mlp.experts.{e}.up_proj.weight"] = realistic(MF, H, 0.15)
                t[p + f"mlp.experts.{e}.down_proj.weight"] = realistic(H, MF, 0.15)
        else:
            t[p + "mlp.gate_proj.weight"] = realistic(F, H, 0.15)
            t[p + "mlp.up_proj.weight"] = realistic(F, H, 0.15)
            t[p + "mlp.down_proj.weight"] = realistic(H, F, 0.15)
    return t


def is_quantized_linear(name):
    return name.endswith("_proj.weight")  # q/k/v/o and MLP/expert projections; not embed, norms, router


def write_folder(d, cfg, tensors, extra=None):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_st(os.path.join(d, "model.safetensors"), tensors)
    for k, v in (extra or {}).items():
        with open(os.path.join(d, k), "w") as f:
            json.dump(v, f, indent=1)


def write_ref(d, cfg, base, deq):
    """the reference: base with the dequantized linears in F32 (the rest stays bf16, exact)"""
    cfg = dict(cfg)
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    t = {n: (deq[n].astype(np.float32), "F32") if n in deq and not np.array_equal(deq[n], w) else (w, "BF16")
         for n, w in base.items()}
    write_folder(d, cfg, t)


# ---------------------------------------------------------------- GPTQ (AutoGPTQ pack())

def pack_along_rows(q, bits):
    """q [R, C] ints -> int32 [R*bits/32, C]: element (r, c) at bits (r % p)*bits of word r//p"""
    p = 32 // bits
    R, C = q.shape
    q = q.astype(np.uint64).reshape(R // p, p, C)
    w = np.zeros((R // p, C), np.uint64)
    for j in range(p):
        w |= q[:, j, :] << np.uint64(bits * j)
    return w.astype(np.uint32).view(np.int32)


def pack_along_cols(q, bits):
    return np.ascontiguousarray(pack_along_rows(np.ascontiguousarray(q.T), bits).T)


def gptq_quantize(W, bits, gs, sym, act, v2):
    """W [N, K] float32 -> (tensors, dequantized W). AutoGPTQ Quantizer + pack()."""
    N, K = W.shape
    maxq = 2 ** bits - 1
    gsz = K if gs == -1 else gs
    G = (K + gsz - 1) // gsz
    if act:  # act-order: a permutation stands in for the Hessian order
        perm = RNG.permutation(K)
        g_idx = np.empty(K, np.int32)
        g_idx[perm] = np.arange(K) // gsz
    else:
        g_idx = (np.arange(K) // gsz).astype(np.int32)
    scales = np.zeros((G, N), np.float16)
    zeros = np.zeros((G, N), np.int64)
    for g in range(G):
        cols = np.nonzero(g_idx == g)[0]
        x = W[:, cols]
        xmin = np.minimum(x.min(1), 0)
        xmax = np.maximum(x.max(1), 0)
        if sym:
            xmax = np.maximum(np.abs(xmin), xmax)
            xmin = np.where(xmin < 0, -xmax, xmin)
        tmp = (xmin == 0) & (xmax == 0)
        xmin[tmp], xmax[tmp] = -1, 1
        s = ((xmax - xmin) / maxq).astype(np.float16)
        z = np.full(N, (maxq + 1) // 2) if sym else np.round(-xmin / s.astype(np.float32))
        scales[g], zeros[g] = s, z
    s_k = scales[g_idx].T.astype(np.float32)  # [N, K]
    z_k = zeros[g_idx].T
    q = np.clip(np.round(W / s_k) + z_k, 0, maxq).astype(np.int64)
    deq = (s_k * (q - z_k)).astype(np.float32)
    zs = zeros if v2 else (zeros - 1) & maxq  # v1: `zeros -= 1` before packing
    t = {
        "qweight": (pack_along_rows(q.T, bits), "I32"),  # [K/p, N]
        "qzeros": (pack_along_cols(zs, bits), "I32"),    # [G, N/p]
        "scales": (scales, "F16"),
        "g_idx": (g_idx, "I32"),
    }
    return t, deq


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_pack(q):
    """q [R, N] in 0..15 -> int32 [R, N/8], nibble i <- column 8c + AWQ_ORDER[i]"""
    R, N = q.shape
    q = q.astype(np.uint64).reshape(R, N // 8, 8)
    w = np.zeros((R, N // 8), np.uint64)
    for i in range(8):
        w |= q[:, :, AWQ_ORDER[i]] << np.uint64(4 * i)
    return w.astype(np.uint32).view(np.int32)


def awq_quantize(W, gs):
    """AutoAWQ pseudo_quantize_tensor (zero_point=True), then the gemm packing."""
    N, K = W.shape
    G = K // gs
    x = W.reshape(N, G, gs)
    mx, mn = x.max(2), x.min(2)
    s = (np.maximum(mx - mn, 1e-5) / 15).astype(np.float16)
    sf = s.astype(np.float32)
    z = np.clip(-np.round(mn / sf), 0, 15)
    q = np.clip(np.round(x / sf[:, :, None]) + z[:, :, None], 0, 15)
    deq = ((q - z[:, :, None]) * sf[:, :, None]).reshape(N, K).astype(np.float32)
    q = q.reshape(N, K).astype(np.int64)
    t = {
        "qweight": (awq_pack(q.T), "I32"),                 # [K, N/8]
        "qzeros": (awq_pack(z.T.astype(np.int64)), "I32"),  # [G, N/8]
        "scales": (np.ascontiguousarray(s.T), "F16"),       # [G, N]
    }
    return t, deq


# ---------------------------------------------------------------- FP8 e4m3 block

def e4m3_values():
    v = []
    for b in range(128):
        e, m = (b >> 3) & 15, b & 7
        if b == 0x7F:
            continue
        v.append((b, (m / 8) * 2 ** -6 if e == 0 else (1 + m / 8) * 2 ** (e - 7)))
    return np.array([c for c, _ in v]), np.array([x for _, x in v])


E4M3_CODES, E4M3_VALS = e4m3_values()


def to_e4m3(x):
    a = np.abs(x)
    i = np.clip(np.searchsorted(E4M3_VALS, a), 1, len(E4M3_VALS) - 1)
    lo, hi = E4M3_VALS[i - 1], E4M3_VALS[i]
    j = np.where(a - lo <= hi - a, i - 1, i)
    code = E4M3_CODES[j] | np.where(x < 0, 0x80, 0)
    return code.astype(np.uint8), np.where(x < 0, -E4M3_VALS[j], E4M3_VALS[j])


def fp8_quantize(W, bn, bk, scale_dtype):
    N, K = W.shape
    nb, kb = -(-N // bn), -(-K // bk)
    sc = np.zeros((nb, kb), np.float32)
    for i in range(nb):
        for j in range(kb):
            sc[i, j] = max(np.abs(W[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]).max(), 1e-8) / 448
    if scale_dtype == "BF16":
        sc = bf16_round(sc)
    s_full = np.repeat(np.repeat(sc, bn, 0), bk, 1)[:N, :K]
    code, val = to_e4m3(W / s_full)
    deq = (val * s_full).astype(np.float32)
    return {"weight": (code, "F8_E4M3"), "weight_scale_inv": (sc, scale_dtype)}, deq


# ---------------------------------------------------------------- variants

def quantize_model(base, cfg, kind, **kw):
    t, deq = {}, {}
    skip = kw.get("skip", [])
    for name, w in base.items():
        mod = name[: -len(".weight")]
        if not is_quantized_linear(name) or mod in skip:
            t[name] = (w, "BF16")
            continue
        if kind == "gptq":
            parts, d = gptq_quantize(w, kw["bits"], kw["gs"], kw["sym"], kw["act"], kw["v2"])
        elif kind == "awq":
            parts, d = awq_quantize(w, kw["gs"])
        else:
            parts, d = fp8_quantize(w, 128, 128, kw["scale_dtype"])
        for k, v in parts.items():
            t[mod + "." + k] = v
        deq[name] = d
    return t, deq


def gptq_variants():
    # every bit width, group size, sym/asym, act-order, v1/v2 appears at least once
    V = [
        ("gptq-int4-g128-sym", 4, 128, True, False, False),   # Qwen's official layout
        ("gptq-int4-g32-asym-act", 4, 32, False, True, False),
        ("gptq-int4-g64-sym-act", 4, 64, True, True, False),
        ("gptq-int4-pc-asym", 4, -1, False, False, False),
        ("gptq-int8-g128-sym-act", 8, 128, True, True, False),
        ("gptq-int8-g32-asym", 8, 32, False, False, False),
        ("gptq-int8-pc-sym", 8, -1, True, False, False),
        ("gptqv2-int4-g64-asym-act", 4, 64, False, True, True),
        ("gptqv2-int8-g64-asym", 8, 64, False, False, True),
    ]
    return V


def gguf_write(path, cfg, tensors, types, tok=None, arch="qwen3"):
    """tensors: HF-named float32 arrays; types: gguf name -> QT"""
    w = gguf.GGUFWriter(path, arch)
    H = cfg["hidden_size"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    if "head_dim" in cfg and cfg["head_dim"]:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if arch == "qwen3moe":
        w.add_expert_count(cfg.get("num_experts", cfg.get("num_local_experts")))
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if tok:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(tok["pre"])
        w.add_token_list(tok["tokens"])
        w.add_token_types(tok["types"])
        w.add_token_merges(tok["merges"])
        w.add_eos_token_id(tok["eos"])
    deq = {}
    for name, qt, arr in gguf_tensors(cfg, tensors, arch):
        tq = types.get(name, QT.F32 if arr.ndim == 1 or not types else QT.F16)
        if arr.ndim == 1:
            tq = QT.F32
        data = quantize(arr, tq)
        w.add_tensor(name, data, raw_dtype=tq)
        deq[name] = gguf.quants.dequantize(data, tq).reshape(arr.shape).astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


def mix_fixture(manifest, name, cfg, base, types):
    """gguf/NAME.gguf (the linears in the given GGUF types) and its reference gguf/NAME-ref (their
    dequantization by gguf.quants), as a manifest pair"""
    deq = gguf_write(f"{OUT}/gguf/{name}.gguf", cfg, base, types)
    ref = {}
    for n in base:
        for g, _, a in gguf_tensors(cfg, {n: base[n]}, "qwen3"):
            ref[n] = deq[g]
    write_ref(f"{OUT}/gguf/{name}-ref", cfg, base, ref)
    manifest["pairs"].append([f"gguf/{name}.gguf", f"gguf/{name}-ref"])


def llama_permute(w, n_head):
    """convert_hf_to_gguf LlamaModel.permute"""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(cfg, t, arch):
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp"}
    out = []
    for n, a in t.items():
        if n == "model.embed_tokens.weight":
            out.append(("token_embd.weight", None, a))
        elif n == "model.norm.weight":
            out.append(("output_norm.weight", None, a))
        elif n == "lm_head.weight":
            out.append(("output.weight", None, a))
        elif ".experts." in n:
            continue
        else:
            parts = n.split(".")
            l = int(parts[2])
            mod = ".".join(parts[3:-1])
            if mod not in names:
                continue
            if arch == "llama" and mod in ("self_attn.q_proj", "self_attn.k_proj"):
                a = llama_permute(a, cfg["num_attention_heads"] if mod.endswith("q_proj") else cfg["num_key_value_heads"])
            out.append((f"blk.{l}.{names[mod]}.{parts[-1]}", None, a))
    if arch == "qwen3moe":
        for l in range(cfg["num_hidden_layers"]):
            E = cfg.get("num_experts", cfg.get("num_local_experts"))
            if f"model.layers.{l}.mlp.experts.0.gate_proj.weight" not in t:
                continue
            for g, h in (("gate", "ffn_gate_exps"), ("up", "ffn_up_exps"), ("down", "ffn_down_exps")):
                out.append((f"blk.{l}.{h}.weight", None,
                            np.stack([t[f"model.layers.{l}.mlp.experts.{e}.{g}_proj.weight"] for e in range(E)])))
    return out


# ---- K-quants: gguf-py has no quantizer for these; round-to-nearest packers
#      written from the block layouts (the dequantizer used for the reference
#      is gguf.quants', i.e. llama.cpp's)

def f16b(x):
    return np.asarray(x, np.float16).reshape(-1, 1).view(np.uint8)


def f16r(x):
    """x rounded to f16, as f32 (the value a block header holds)"""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def q4k_like(x, five):
    nb = x.shape[0]
    x = x.reshape(nb, 8, 32)
    mn = np.minimum(x.min(2), 0)
    mx = np.maximum(x.max(2), 0)
    maxq = 31 if five else 15
    sc, m = (mx - mn) / maxq, -mn
    d = (sc.max(1) / 63).astype(np.float16)
    dmin = (m.max(1) / 63).astype(np.float16)
    df, dmf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    isc = np.clip(np.round(np.divide(sc, df, out=np.zeros_like(sc), where=df > 0)), 0, 63).astype(np.int64)
    im = np.clip(np.round(np.divide(m, dmf, out=np.zeros_like(m), where=dmf > 0)), 0, 63).astype(np.int64)
    S = (df * isc)[:, :, None]
    M = (dmf * im)[:, :, None]
    q = np.clip(np.round(np.divide(x + M, S, out=np.zeros_like(x), where=S > 0)), 0, maxq).astype(np.int64)
    scales = np.zeros((nb, 12), np.int64)
    for j in range(4):
        scales[:, j] = (isc[:, j] & 63) | ((isc[:, j + 4] >> 4) << 6)
        scales[:, j + 4] = (im[:, j] & 63) | ((im[:, j + 4] >> 4) << 6)
        scales[:, j + 8] = (isc[:, j + 4] & 15) | ((im[:, j + 4] & 15) << 4)
    q = q.reshape(nb, 4, 2, 32)
    qs = ((q[:, :, 0, :] & 15) | ((q[:, :, 1, :] & 15) << 4)).reshape(nb, 128)
    parts = [f16b(d), f16b(dmin), scales.astype(np.uint8)]
    if five:
        qh = np.zeros((nb, 32), np.int64)
        qq = q.reshape(nb, 8, 32)
        for b in range(8):
            qh |= ((qq[:, b, :] >> 4) & 1) << b
        parts.append(qh.astype(np.uint8))
    parts.append(qs.astype(np.uint8))
    return np.concatenate(parts, axis=1)


def q6k(x):
    nb = x.shape[0]
    x = x.reshape(nb, 16, 16)
    amax = np.abs(x).max(2)
    s = amax / 31
    d = (np.abs(s).max(1) / 127).astype(np.float16)
    df = d.astype(np.float32)[:, None]
    isc = np.clip(np.round(np.divide(s, df, out=np.zeros_like(s), where=df > 0)), -128, 127).astype(np.int64)
    S = (df * isc)[:, :, None]
    q = np.clip(np.round(np.divide(x, S, out=np.zeros_like(x), where=S != 0)), -32, 31).astype(np.int64) + 32
    q = q.reshape(nb, 2, 4, 32)  # half, quarter s, l
    ql = np.zeros((nb, 2, 64), np.int64)
    qh = np.zeros((nb, 2, 32), np.int64)
    ql[:, :, :32] = q[:, :, 0, :] & 15
    ql[:, :, 32:] = q[:, :, 1, :] & 15
    ql[:, :, :32] |= (q[:, :, 2, :] & 15) << 4
    ql[:, :, 32:] |= (q[:, :, 3, :] & 15) << 4
    for sq in range(4):
        qh |= (q[:, :, sq, :] >> 4) << (2 * sq)
    return np.concatenate([ql.reshape(nb, 128).astype(np.uint8), qh.reshape(nb, 64).astype(np.uint8),
                           isc.astype(np.int8).view(np.uint8), f16b(d)], axis=1)


IQ4_KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def div0(a, b):
    """a / b, 0 where b is 0 (the round-to-nearest packers' scales may be)"""
    return np.where(b != 0, a / np.where(b != 0, b, 1), 0)


def iq4_index(x, scale):
    """the index of the IQ4 value nearest x / scale (scale 0: the value 1)"""
    v = div0(x, scale)
    return np.abs(v[..., None] - IQ4_KV).argmin(-1).astype(np.uint8)


def iq4_nibbles(idx):
    """[..., 32] indices -> [..., 16] bytes: weight i low nibble, 16 + i high (Q4_0's order)"""
    return idx[..., :16] | (idx[..., 16:] << 4)


def iq4nl(blocks):
    """round to nearest: d = the block's signed largest value / -127, then the nearest kv"""
    nb = blocks.shape[0]
    big = blocks[np.arange(nb), np.abs(blocks).argmax(1)]
    d = f16r(big / -127.0)
    return np.concatenate([f16b(d), iq4_nibbles(iq4_index(blocks, d[:, None]))], axis=1)


def iq4xs(blocks):
    """round to nearest: sub-block scale amax / 127 as d (ls - 32), ls in 0..63, d = the largest / 31"""
    nb = blocks.shape[0]
    sub = blocks.reshape(nb, 8, 32)
    s = np.abs(sub).max(2) / 127.0
    d = f16r(s.max(1) / 31.0)
    ls = np.clip(np.rint(div0(s, d[:, None])) + 32, 0, 63).astype(np.uint16)
    idx = iq4_index(sub, (d[:, None] * (ls.astype(np.float32) - 32))[..., None])
    sh = np.zeros(nb, np.uint16)
    for j in range(8):
        sh |= (ls[:, j] >> 4) << (2 * j)
    sl = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)
    return np.concatenate([f16b(d), sh.view(np.uint8).reshape(nb, 2), sl, iq4_nibbles(idx).reshape(nb, 128)], axis=1)


def k23_codes(q):
    """[nb, 256] 2-bit codes -> [nb, 64] bytes: weight 128c + 32s + l at bits 2s of byte 32c + l"""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    out = np.zeros((q.shape[0], 2, 32), np.uint8)
    for sq in range(4):
        out |= (q[:, :, sq, :] & 3) << (2 * sq)
    return out.reshape(-1, 64)


def q2k(x):
    """round to nearest: per 16 weights a scale (max - min) / 3 and a min -min, as 4-bit multiples of d / dmin"""
    nb = x.shape[0]
    sub = x.reshape(nb, 16, 16)
    mn, mx = np.minimum(sub.min(2), 0), np.maximum(sub.max(2), 0)
    scf, mf = (mx - mn) / 3, -mn
    d, dmin = f16r(scf.max(1) / 15), f16r(mf.max(1) / 15)
    sc = np.clip(np.rint(div0(scf, d[:, None])), 0, 15)
    m = np.clip(np.rint(div0(mf, dmin[:, None])), 0, 15)
    step = (d[:, None] * sc)[..., None]
    q = np.clip(np.rint(div0(sub + (dmin[:, None] * m)[..., None], step)), 0, 3).astype(np.uint8)
    scales = (sc.astype(np.uint8) | (m.astype(np.uint8) << 4))
    return np.concatenate([scales, k23_codes(q.reshape(nb, 256)), f16b(d), f16b(dmin)], axis=1)


def q3k(x):
    """round to nearest: per 16 weights a scale max |x| / 4 as a 6-bit multiple of d (less 32), codes -4..3"""
    nb = x.shape[0]
    sub = x.reshape(nb, 16, 16)
    sf = np.abs(sub).max(2) / 4
    d = f16r(sf.max(1) / 31)
    sc = np.clip(np.rint(div0(sf, d[:, None])) + 32, 0, 63).astype(np.uint8)
    step = (d[:, None] * (sc.astype(np.float32) - 32))[..., None]
    q = np.clip(np.rint(div0(sub, step)), -4, 3).astype(np.int16) + 4
    u = q.reshape(nb, 256).astype(np.uint8)
    hmask = np.zeros((nb, 32), np.uint8)
    for i in range(8):
        hmask |= ((u[:, 32 * i:32 * i + 32] >> 2) & 1) << i
    scb = np.zeros((nb, 12), np.uint8)
    for j in range(16):
        scb[:, j % 8] |= (sc[:, j] & 15) << (4 * (j // 8))
        scb[:, 8 + j % 4] |= (sc[:, j] >> 4) << (2 * (j // 4))
    return np.concatenate([hmask, k23_codes(u & 3), scb, f16b(d)], axis=1)


def quantize(arr, qt):
    arr = np.asarray(arr, np.float32)
    if qt in (QT.Q2_K, QT.Q3_K):
        shp = arr.shape
        b = (q2k if qt == QT.Q2_K else q3k)(arr.reshape(-1, 256))
        return b.reshape(*shp[:-1], shp[-1] // 256 * gguf.GGML_QUANT_SIZES[qt][1])
    if qt in (QT.IQ4_NL, QT.IQ4_XS):
        shp = arr.shape
        be = 32 if qt == QT.IQ4_NL else 256
        b = (iq4nl if qt == QT.IQ4_NL else iq4xs)(arr.reshape(-1, be))
        return b.reshape(*shp[:-1], shp[-1] // be * gguf.GGML_QUANT_SIZES[qt][1])
    if qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        shp = arr.shape
        blocks = arr.reshape(-1, 256)
        b = q6k(blocks) if qt == QT.Q6_K else q4k_like(blocks, qt == QT.Q5_K)
        return b.reshape(*shp[:-1], shp[-1] // 256 * gguf.GGML_QUANT_SIZES[qt][1])
    if qt == QT.F32:
        return arr
    if qt == QT.F16:
        return arr.astype(np.float16)
    return gguf.quants.quantize(arr, qt)


def small_tokenizer(vocab):
    """A byte-level BPE vocabulary of `vocab` entries cut from Qwen3's: the
    256 byte tokens, the first merges whose parts are already in, and three
    special tokens at the end."""
    path = "/work/shared/models/qwen3-tokenizer/tokenizer.json"
    if not os.path.exists(path):
        path = "../shared/models/qwen3-tokenizer/tokenizer.json"
    tj = json.load(open(path))
    v = tj["model"]["vocab"]
    byid = sorted(v.items(), key=lambda kv: kv[1])
    tokens = [t for t, i in byid[:256]]
    have = set(tokens)
    merges = []
    for m in tj["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ")
        if a in have and b in have and a + b not in have:
            merges.append(a + " " + b)
            tokens.append(a + b)
            have.add(a + b)
        if len(tokens) == vocab - 3:
            break
    types = [1] * len(tokens)
    for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(s)
        types.append(3)
    return {"tokens": tokens, "types": types, "merges": merges, "pre": "qwen2", "eos": vocab - 3}


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    manifest = {"pairs": [], "gguf_vs_st": []}
    cfg = base_config()
    base = make_base(cfg)
    write_folder(f"{OUT}/micro", cfg, {n: (w, "BF16") for n, w in base.items()})
    mcfg = base_config(moe=True)
    mbase = make_base(mcfg)
    write_folder(f"{OUT}/micro-moe", mcfg, {n: (w, "BF16") for n, w in mbase.items()})

    def emit(name, c, b, kind, qc, extra=None, **kw):
        t, deq = quantize_model(b, c, kind, **kw)
        qcfg = dict(c)
        qcfg["quantization_config"] = qc
        if kind != "fp8":
            qcfg["torch_dtype"] = "float16"
        write_folder(f"{OUT}/{name}", qcfg, t, extra)
        write_ref(f"{OUT}/{name}-ref", c, b, deq)
        manifest["pairs"].append([name, name + "-ref"])

    for name, bits, gs, sym, act, v2 in gptq_variants():
        qc = {"bits": bits, "group_size": gs, "damp_percent": 0.01, "desc_act": act, "static_groups": False,
              "sym": sym, "true_sequential": True, "quant_method": "gptq", "checkpoint_format": "gptq_v2" if v2 else "gptq"}
        qcj = {k: v for k, v in qc.items() if k != "quant_method"}
        emit(name, cfg, base, "gptq", qc, {"quantize_config.json": qcj}, bits=bits, gs=gs, sym=sym, act=act, v2=v2)
    # MoE: every expert a separate GPTQ linear; the router stays bf16
    emit("moe-gptq-int4-g32-asym-act", mcfg, mbase, "gptq",
         {"bits": 4, "group_size": 32, "desc_act": True, "sym": False, "quant_method": "gptq", "checkpoint_format": "gptq"},
         bits=4, gs=32, sym=False, act=True, v2=False)
    for gs in (64, 32):
        emit(f"awq-int4-g{gs}", cfg, base, "awq",
             {"bits": 4, "group_size": gs, "modules_to_not_convert": None, "quant_method": "awq", "version": "gemm", "zero_point": True},
             gs=gs)
    emit("moe-awq-int4-g32", mcfg, mbase, "awq",
         {"bits": 4, "group_size": 32, "quant_method": "awq", "version": "gemm", "zero_point": True}, gs=32)
    # FP8: bf16 scales, partial edge blocks (64 < 128), one module left unconverted
    emit("fp8-bf16scale", cfg, base, "fp8",
         {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128],
          "modules_to_not_convert": ["lm_head", "model.layers.0.self_attn.o_proj"]},
         scale_dtype="BF16", skip=["model.layers.0.self_attn.o_proj"])
    emit("moe-fp8", mcfg, mbase, "fp8",
         {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128],
          "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]}, scale_dtype="F32")

    # ---- GGUF
    os.makedirs(f"{OUT}/gguf", exist_ok=True)
    lin = lambda T: {n: T for n, _, a in gguf_tensors(cfg, base, "qwen3") if a.ndim == 2}
    for tname, T in (("f32", QT.F32), ("f16", QT.F16), ("bf16", QT.BF16), ("q8_0", QT.Q8_0), ("q4_0", QT.Q4_0)):
        deq = gguf_write(f"{OUT}/gguf/micro-{tname}.gguf", cfg, base, lin(T))
        if T in (QT.F32, QT.F16, QT.BF16):  # bf16 weights are exact in f32, bf16 and (at these magnitudes) f16
            manifest["pairs"].append([f"gguf/micro-{tname}.gguf", "micro"])
            continue
        ref = {}
        for n in base:  # gguf names back to HF for the reference
            for g, _, a in gguf_tensors(cfg, {n: base[n]}, "qwen3"):
                ref[n] = deq[g]
        write_ref(f"{OUT}/gguf/micro-{tname}-ref", cfg, base, ref)
        manifest["pairs"].append([f"gguf/micro-{tname}.gguf", f"gguf/micro-{tname}-ref"])
    # a GGUF file alone is enough to run: a tokenizer cut from Qwen3's in the metadata
    tcfg = base_config(vocab=320)
    tok = small_tokenizer(tcfg["vocab_size"])
    gguf_write(f"{OUT}/gguf/micro-tok-q8_0.gguf", tcfg, make_base(tcfg),
               {n: QT.Q8_0 for n, _, a in gguf_tensors(tcfg, make_base(tcfg), "qwen3") if a.ndim == 2}, tok=tok)
    # K-quants, Q4_1, Q5_0, Q5_1 in one file, on a model whose rows are multiples of 256
    kcfg = base_config(hidden=256, ffn=64, vocab=128, heads=1, kv=1, head_dim=64)
    kbase = make_base(kcfg)
    ktypes = {"blk.0.attn_q.weight": QT.Q4_K, "blk.0.attn_k.weight": QT.Q5_K, "blk.0.attn_v.weight": QT.Q6_K,
              "blk.0.attn_output.weight": QT.Q4_1, "blk.0.ffn_gate.weight": QT.Q6_K, "blk.0.ffn_up.weight": QT.Q4_K,
              "blk.0.ffn_down.weight": QT.Q5_0, "token_embd.weight": QT.Q5_1}
    mix_fixture(manifest, "kmix", kcfg, kbase, ktypes)

    # the repository's tiny fixtures converted: against kiln's safetensors path
    # MoE mapping (merged expert tensors split per expert), exact weights
    gguf_write(f"{OUT}/gguf/micro-moe-f32.gguf", mcfg, mbase, {}, arch="qwen3moe")
    manifest["pairs"].append(["gguf/micro-moe-f32.gguf", "micro-moe"])
    for fx, arch, T, tol in (("qwen2-tiny", "qwen2", QT.F16, 2e-3), ("llama-tiny", "llama", QT.F16, 2e-3),
                             ("qwen3-moe-tiny", "qwen3moe", QT.Q4_0, 1.0)):
        fcfg = json.load(open(f"tests/fixtures/{fx}/config.json"))
        fcfg.setdefault("rope_theta", (fcfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        if "head_dim" not in fcfg or not fcfg["head_dim"]:
            fcfg["head_dim"] = fcfg["hidden_size"] // fcfg["num_attention_heads"]
        ft = {k: v.astype(np.float32) for k, v in load_bf16(f"tests/fixtures/{fx}/model.safetensors").items()}
        types = {n: T for n, _, a in gguf_tensors(fcfg, ft, arch) if a.ndim >= 2}
        gguf_write(f"{OUT}/gguf/{fx}-{T.name.lower()}.gguf", fcfg, ft, types, arch=arch)
        manifest["gguf_vs_st"].append([f"gguf/{fx}-{T.name.lower()}.gguf", fx, tol])

    # IQ4_NL and IQ4_XS (their values looked up in a 16-entry table; XS with 6-bit sub-block scales), after every
    # other fixture so the random draws above stay the same
    icfg = base_config(hidden=256, ffn=256, vocab=128, heads=2, kv=1, head_dim=64)
    ibase = make_base(icfg)
    itypes = {"blk.0.attn_q.weight": QT.IQ4_XS, "blk.0.attn_k.weight": QT.IQ4_NL, "blk.0.attn_v.weight": QT.IQ4_XS,
              "blk.0.attn_output.weight": QT.IQ4_NL, "blk.0.ffn_gate.weight": QT.IQ4_XS, "blk.0.ffn_up.weight": QT.IQ4_NL,
              "blk.0.ffn_down.weight": QT.IQ4_XS, "token_embd.weight": QT.IQ4_NL}
    mix_fixture(manifest, "iq4mix", icfg, ibase, itypes)
    # Q2_K and Q3_K, after the files above for the same reason
    lcfg = base_config(hidden=256, ffn=256, vocab=128, heads=4, kv=1, head_dim=64)
    lbase = make_base(lcfg)
    ltypes = {"blk.0.attn_q.weight": QT.Q3_K, "blk.0.attn_k.weight": QT.Q2_K, "blk.0.attn_v.weight": QT.Q3_K,
              "blk.0.attn_output.weight": QT.Q2_K, "blk.0.ffn_gate.weight": QT.Q3_K, "blk.0.ffn_up.weight": QT.Q2_K,
              "blk.0.ffn_down.weight": QT.Q3_K, "token_embd.weight": QT.Q2_K}
    mix_fixture(manifest, "k23mix", lcfg, lbase, ltypes)

    with open(f"{OUT}/manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
    total = sum(os.path.getsize(os.path.join(r, x)) for r, _, fs in os.walk(OUT) for x in fs)
    print(f"wrote {OUT}: {total / 1e6:.2f} MB")


def load_bf16(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        h = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        raw = data[b:e]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] == "F32":
            a = np.frombuffer(raw, np.float32)
        else:
            raise SystemExit(f"{path}: {k}: dtype {v['dtype']}")
        out[k] = a.reshape(v["shape"])
    return out


def quality_model(out, config="configs/qwen3-0.6b.json", outliers=True):
    """A model of real shape (qwen3-0.6b dims) for docs/quant.md's quality
    table: linears N(0, 0.02) with log-normal per-row scales (sigma 0.3) and
    1/32 of the input columns 4x (outlier channels, as activation-aware
    methods assume); embedding N(0, 0.08) so the tied logits have a spread
    like a trained model's (std ~2.5); norms 1 +- 0.1. bf16."""
    cfg = json.load(open(config))
    H, F, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    qd, kvd, hd = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["head_dim"]
    t = {"model.embed_tokens.weight": bf16_round(RNG.standard_normal((V, H), np.float32) * 0.08),
         "model.norm.weight": bf16_round(1 + 0.1 * RNG.standard_normal(H))}
    for l in range(L):
        p = f"model.layers.{l}."
        for n, d in (("input_layernorm", H), ("post_attention_layernorm", H), ("self_attn.q_norm", hd), ("self_attn.k_norm", hd)):
            t[p + n + ".weight"] = bf16_round(1 + 0.1 * RNG.standard_normal(d))
        for n, r, c in (("self_attn.q_proj", qd, H), ("self_attn.k_proj", kvd, H), ("self_attn.v_proj", kvd, H), ("self_attn.o_proj", H, qd),
                        ("mlp.gate_proj", F, H), ("mlp.up_proj", F, H), ("mlp.down_proj", H, F)):
            t[p + n + ".weight"] = realistic(r, c, 0.02, outliers)
    write_folder(out, cfg, {n: (w, "BF16") for n, w in t.items()})
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--quality-model":
        quality_model(sys.argv[2], outliers="--no-outliers" not in sys.argv)
    else:
        main()
