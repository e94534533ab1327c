#!/usr/bin/env bash
# SGLang's benchmark client (sglang.bench_serving, sglang 0.5.10.post1) against a
# running OpenAI-compatible server (kiln serve) on 127.0.0.1, offline.
#
#   OUT=/some/dir tools/sglang/run.sh [PORT=8000] [MODEL=qwen3-8b]
#
# Run from the repository root (it cd's there itself).  Needs .whl/ (the
# wheels), tools/sglang/launch.py and tools/sglang/prompts.py.
# Per concurrency c it writes $OUT/sglbench_c$c.jsonl (bench_serving's JSON
# result line) and $OUT/sglbench_c$c.log, then prints one summary line each.
#
# Environment knobs (optional):
#   SGLBENCH_RUNS="1:16 8:64 32:128 64:256"   concurrency:num_prompts pairs
#   SGLBENCH_DATASET=random|random-ids         default random (local prompt file,
#        exact 256-token prompts); random-ids = decoded consecutive token ids,
#        no prompt file, but the server re-tokenizes them to ~255-323 tokens
#   SGLBENCH_TOKENIZER=tests/fixtures/qwen3-dense-tiny
#   SGLBENCH_IN=256 SGLBENCH_OUTLEN=256 SGLBENCH_READY_S=120
set -uo pipefail

PORT=${1:-8000}
MODEL=${2:-qwen3-8b}
: "${OUT:?set OUT to an output directory}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.." || exit 1
TOK=${SGLBENCH_TOKENIZER:-tests/fixtures/qwen3-dense-tiny}
RUNS=${SGLBENCH_RUNS:-"1:16 8:64 32:128 64:256"}
DATASET=${SGLBENCH_DATASET:-random}
IN_LEN=${SGLBENCH_IN:-256}
OUT_LEN=${SGLBENCH_OUTLEN:-256}
READY_S=${SGLBENCH_READY_S:-120}
mkdir -p "$OUT"

# --- wheels (sglang + aiohttp & deps + pyzmq + pybase64 + psutil) ----------
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || { echo "sglbench: wheel install failed" >&2; exit 1; }

# never touch the network: tokenizer from a local folder, no ShareGPT download
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

# bench_serving run exactly as `python3 -m sglang.bench_serving`, minus the
# package __init__ files it does not need (see sglbench_launch.py)
BENCH=(python3 tools/sglang/launch.py)
"${BENCH[@]}" --help > "$OUT/sglbench_help.txt" 2> "$OUT/sglbench_import.err" \
  || { echo "sglbench: bench_serving does not import:" >&2; tail -20 "$OUT/sglbench_import.err" >&2; exit 1; }

DS_ARGS=(--dataset-name "$DATASET")
if [ "$DATASET" = random ]; then
  # ShareGPT-format file of 600 distinct 320-token windows of repo text;
  # bench_serving truncates each to $IN_LEN tokens
  python3 tools/sglang/prompts.py "$TOK" "$OUT/sglbench_prompts.json" 600 $((IN_LEN + 64)) \
    || { echo "sglbench: prompt file failed" >&2; exit 1; }
  DS_ARGS+=(--dataset-path "$OUT/sglbench_prompts.json")
fi

echo "sglbench: sglang $(python3 -c 'import importlib.metadata as m; print(m.version("sglang"))' 2>/dev/null)," \
  "server 127.0.0.1:$PORT model $MODEL, $DATASET in=$IN_LEN out=$OUT_LEN (ignore_eos on)"
rc=0
for run in $RUNS; do
  c=${run%%:*}; n=${run##*:}
  res="$OUT/sglbench_c$c.jsonl"; rm -f "$res"
  # --model is the local tokenizer folder (so bench_serving's chat-template
  # check reads it instead of the Hub); requests carry --served-model-name.
  # --flush-cache: POST /flush_cache after warmup, so no run reuses an earlier
  # run's prefixes.  ignore_eos is sent by default (no --disable-ignore-eos).
  cmd=("${BENCH[@]}" --backend vllm --host 127.0.0.1 --port "$PORT"
       --model "$TOK" --served-model-name "$MODEL" --tokenizer "$TOK"
       "${DS_ARGS[@]}" --random-input-len "$IN_LEN" --random-output-len "$OUT_LEN"
       --random-range-ratio 1.0 --num-prompts "$n" --max-concurrency "$c"
       --request-rate inf --warmup-requests 1 --flush-cache --seed 1
       --ready-check-timeout-sec "$READY_S" --disable-tqdm
       --tag "kiln-c$c" --output-file "$res")
  echo "+ ${cmd[*]}" > "$OUT/sglbench_c$c.log"
  "${cmd[@]}" >> "$OUT/sglbench_c$c.log" 2>&1 || { echo "sglbench: c=$c failed (rc $?), see $OUT/sglbench_c$c.log" >&2; tail -5 "$OUT/sglbench_c$c.log" >&2; rc=1; }
  python3 - "$res" "$c" "$n" <<'EOF' || rc=1
import json, sys
path, c, n = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    r = json.loads(open(path).read().splitlines()[-1])
except Exception as e:
    print(f"c={c:>3} n={n:>3}: no result ({e})"); sys.exit(1)
print(f"c={c:>3} n={n:>3} completed={r['completed']:>3}  output {r['output_throughput']:9.1f} tok/s"
      f"  median TTFT {r['median_ttft_ms']:9.2f} ms  median TPOT {r['median_tpot_ms']:7.2f} ms"
      f"  (in {r['total_input_tokens']} / out {r['total_output_tokens']} tok, {r['duration']:.1f} s)")
sys.exit(0 if r["completed"] == int(n) else 1)
EOF
done
exit $rc
