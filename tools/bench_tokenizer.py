#!/usr/bin/env python3
"""bench_tokenizer.py: kiln's tokenizer against Hugging Face `tokenizers`.

Builds a deterministic mixed text (English prose from the docs, Chinese made
by a seeded generator over common characters, C code from src/, plus the
tokenizer test vectors), writes it to a temp file, and encodes it:

  kiln   `kiln tokenize -m MODEL --time` (whole text) and `--lines` (each line
         on its own); kiln reports load time and encode MB/s on stderr,
         timing only the tokenizer calls (no I/O).
  HF     tokenizers.Tokenizer.from_file, single-threaded
         (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false): encode() on the
         whole text, then encode() per line in a Python loop (no
         encode_batch).

It checks that both give the same ids and prints both throughputs.

  python3 tools/bench_tokenizer.py [--kiln build/kiln] [--model DIR] [--mb 4]
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_text(mb):
    rng = random.Random(1234)
    english = []
    for pat in ("docs/*.md", "README.md", "../shared/*.md", "../shared/reference/**/*.md"):
        for p in sorted(glob.glob(os.path.join(ROOT, pat), recursive=True)):
            english.append(open(p, encoding="utf-8", errors="replace").read())
    code = [open(p, encoding="utf-8", errors="replace").read()
            for p in sorted(glob.glob(os.path.join(ROOT, "src/**/*.c"), recursive=True))]
    vectors = json.load(open(os.path.join(ROOT, "tests/fixtures/tokenizer/qwen3_vectors.json")))
    vec_text = "\n".join(c["text"] for c in vectors["cases"])
    common = ("的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从"
              "模型推理服务器令牌文本生成速度内存显卡并行缓存请求调度")
    punct = "，。、；：？！"

    def chinese(n):
        out = []
        for _ in range(n):
            out.append("".join(rng.choice(common) for _ in range(rng.randint(4, 18))))
            out.append(rng.choice(punct))
            if rng.random() < 0.08:
                out.append("\n")
        return "".join(out)

    parts, size, target = [], 0, int(mb * 1e6)
    while size < target:
        for chunk in (rng.choice(english) if english else "", chinese(400), rng.choice(code) if code else "", vec_text):
            parts.append(chunk)
            size += len(chunk.encode("utf-8"))
    return "\n".join(parts)


def run_kiln(kiln, model, path, lines):
    cmd = [kiln, "tokenize", "-m", model, "--time"] + (["--lines"] if lines else [])
    with open(path, "rb") as f:
        p = subprocess.run(cmd, stdin=f, capture_output=True, check=True)
    ids = [[int(x) for x in line.split(",")] if line else [] for line in p.stdout.decode().split("\n")[:-1]]
    stats = {}
    for line in p.stderr.decode().splitlines():
        if line.startswith("load:"):
            stats["load_ms"] = float(line.split()[1])
        if line.startswith("encode:"):
            stats["mbs"] = float(line.split(",")[3].split()[0])
            stats["ms"] = float(line.split(",")[2].split()[0])
    return ids, stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build/kiln"))
    ap.add_argument("--model", default=os.path.join(ROOT, "tests/fixtures/qwen3-dense-tiny"))
    ap.add_argument("--mb", type=float, default=4.0)
    args = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    text = build_text(args.mb)
    data = text.encode("utf-8")
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(data)
        path = f.name
    lines = text.splitlines(keepends=True)
    print(f"text: {len(data) / 1e6:.2f} MB, {len(lines)} lines; tokenizers {tokenizers.__version__}; "
          f"model {os.path.normpath(args.model)}")

    t0 = time.perf_counter()
    hf = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    hf_load = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    hf_ids = hf.encode(text, add_special_tokens=False).ids
    hf_whole = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf_line_ids = [hf.encode(l, add_special_tokens=False).ids for l in lines]
    hf_lines = time.perf_counter() - t0

    k_ids, k = run_kiln(args.kiln, args.model, path, False)
    kl_ids, kl = run_kiln(args.kiln, args.model, path, True)
    os.unlink(path)

    same_whole = k_ids == [hf_ids]
    same_lines = kl_ids == hf_line_ids
    mb = len(data) / 1e6
    print(f"{'':22}{'kiln':>12}{'HF tokenizers':>16}")
    print(f"{'load (ms)':22}{k['load_ms']:12.1f}{hf_load:16.1f}")
    print(f"{'encode whole (MB/s)':22}{k['mbs']:12.2f}{mb / hf_whole:16.2f}")
    print(f"{'encode per line (MB/s)':22}{kl['mbs']:12.2f}{mb / hf_lines:16.2f}")
    print(f"tokens: {len(hf_ids)}; ids agree: whole {same_whole}, per line {same_lines}")
    if not (same_whole and same_lines):
        if not same_whole and k_ids:
            a, b = k_ids[0], hf_ids
            i = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
            print(f"first difference at token {i}: kiln {a[i:i + 5]} HF {b[i:i + 5]}")
        sys.exit(1)


if __name__ == "__main__":
    main()
