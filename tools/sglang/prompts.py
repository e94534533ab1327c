"""Write a ShareGPT-format JSON of distinct text prompts for
`bench_serving --dataset-name random --dataset-path FILE`, so that the
`random` dataset never downloads ShareGPT.  Text comes from this repository's
docs and C sources (then the Python standard library if that is not enough);
each prompt is a distinct window of WINDOW tokens, which bench_serving then
truncates to --random-input-len tokens (natural text re-tokenizes to the same
length, unlike random-ids' decoded random token ids).

usage: sglbench_prompts.py TOKENIZER_DIR OUT.json [N=600] [WINDOW=320]
"""
import glob
import json
import os
import sys
import sysconfig

from transformers import AutoTokenizer


def main():
    tok_dir, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 600
    window = int(sys.argv[4]) if len(sys.argv) > 4 else 320
    tok = AutoTokenizer.from_pretrained(tok_dir, trust_remote_code=True)
    files = sorted(glob.glob("README.md") + glob.glob("docs/**/*.md", recursive=True))
    files += sorted(glob.glob("src/**/*.[ch]", recursive=True))
    files += sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    convs = []
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                ids = tok.encode(f.read(), add_special_tokens=False)
        except OSError:
            continue
        for i in range(0, len(ids) - window + 1, window):
            text = tok.decode(ids[i : i + window])
            convs.append({"conversations": [
                {"from": "human", "value": text},
                {"from": "gpt", "value": "ok"},
            ]})
            if len(convs) >= n:
                break
        if len(convs) >= n:
            break
    with open(out, "w") as f:
        json.dump(convs, f)
    print(f"[sglbench] {len(convs)} prompts of {window} tokens -> {out}", file=sys.stderr)
    if len(convs) < n:
        sys.exit(f"only {len(convs)} prompts (wanted {n})")


if __name__ == "__main__":
    main()
