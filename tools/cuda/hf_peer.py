"""tools/cuda/hf_peer.py: the Hugging Face transformers peer for kiln bench
on the GPU machine: the same config (configs/NAME.json), random weights,
bf16, sdpa attention, batch 1.

  python3 tools/cuda/hf_peer.py qwen3-8b 128,1024,8192 128

prefill: one forward over p random ids (logits of the last position only),
median of 3 after a warm-up; decode: n single-token forwards with the
KV cache after a one-token prompt, tok/s = n / time. Prints a markdown table.
"""
import json, sys, time
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

name, pps, n_gen = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
d = json.load(open(f"configs/{name}.json"))
mt = d.pop("model_type")
cfg = AutoConfig.for_model(mt, **d)
torch.manual_seed(0)
t0 = time.time()
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
model.eval()
print(f"# transformers {transformers.__version__}, torch {torch.__version__}, {name}, load {time.time()-t0:.1f}s", flush=True)
V = cfg.vocab_size
rows = []

def sync_time(f):
    torch.cuda.synchronize(); t = time.time(); f(); torch.cuda.synchronize(); return time.time() - t

with torch.inference_mode():
    for p in pps:
        ids = torch.randint(0, V, (1, p), device="cuda")
        f = lambda: model(ids, use_cache=False, logits_to_keep=1)
        f()
        ts = sorted(sync_time(f) for _ in range(3))
        rows.append((f"pp{p}", p / ts[1], ts[1] * 1e3))
        print(rows[-1], flush=True)
    ids = torch.randint(0, V, (1, 1), device="cuda")
    out = model(ids, use_cache=True)
    pkv = out.past_key_values
    def dec():
        nonlocal_pkv = pkv
        tok = ids
        for _ in range(n_gen):
            o = model(tok, past_key_values=nonlocal_pkv, use_cache=True)
            nonlocal_pkv = o.past_key_values
            tok = o.logits[:, -1:].argmax(-1)
    t = sync_time(dec)
    rows.append((f"tg{n_gen}", n_gen / t, None))
mem = torch.cuda.max_memory_allocated() / 2**20
print(f"| peer | test | t/s | TTFT(ms) | peak mem (MiB) |\n|---|---|---:|---:|---:|")
for r in rows:
    print(f"| transformers {name} | {r[0]} | {r[1]:.1f} | {'' if r[2] is None else f'{r[2]:.1f}'} | {mem:.0f} |")
