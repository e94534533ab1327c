"""The command-line contracts other tools rely on, checked on the fixtures.

- `kiln run --ids ... --print-ids` prints only the generated ids on one line,
  and with --greedy they are the transformers greedy continuation;
- `kiln logits --out FILE` writes vocab float32 values equal (1e-3) to the
  transformers reference;
- `kiln run -p TEXT` and `--chat -p TEXT` work end to end with the model's
  tokenizer and chat template, and the same seed gives the same text;
- `kiln tokenize` / `--decode` round trip; `kiln template` prints only the
  rendering;
- bad input: a missing model, a malformed id list, an unknown option exit
  non-zero with a message on stderr.

The binary is $KILN (default build/kiln).
"""
import json
import os
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "kiln"))
FIX = os.path.join(ROOT, "tests", "fixtures")
TINY = os.path.join(FIX, "qwen3-dense-tiny")


def kiln(*args, stdin=None):
    if not os.path.exists(KILN):
        pytest.skip(f"{KILN} not built")
    return subprocess.run([KILN, *args], input=stdin, capture_output=True, timeout=300)


def reference(name):
    with open(os.path.join(FIX, name, "reference.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("name", ["qwen3-dense-small", "qwen3-moe-tiny", "llama-tiny"])
def test_run_print_ids_is_the_greedy_continuation(name):
    ref = reference(name)
    prompt, want = ref["prompts"][1], ref["greedy"][1]
    r = kiln("run", "-m", os.path.join(FIX, name), "--ids", ",".join(map(str, prompt)), "-n", str(len(want)),
             "--greedy", "--ignore-eos", "--print-ids", "-t", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().strip().split("\n")
    assert len(lines) == 1, "one line and nothing else on stdout"
    assert [int(x) for x in lines[0].split(",")] == want


def test_logits_file_matches_reference(tmp_path):
    name = "qwen3-dense-small"
    ref = reference(name)
    out = tmp_path / "last.f32"
    r = kiln("logits", "-m", os.path.join(FIX, name), "--ids", ",".join(map(str, ref["prompts"][2])), "--out", str(out))
    assert r.returncode == 0, r.stderr
    vocab = ref["last_logits"]["shape"][1]
    got = struct.unpack(f"<{vocab}f", out.read_bytes())
    with open(os.path.join(FIX, name, "last_logits.f32"), "rb") as f:
        f.seek(2 * vocab * 4)
        want = struct.unpack(f"<{vocab}f", f.read(vocab * 4))
    assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-3


def test_run_text_and_chat():
    r = kiln("run", "-m", TINY, "-p", "Hello, world", "-n", "6", "--greedy", "--ignore-eos", "--print-ids")
    assert r.returncode == 0, r.stderr
    ids = r.stdout.decode().strip()
    # the prompt is tokenized as HF does: "Hello, world" -> 9707, 11, 1879
    r2 = kiln("run", "-m", TINY, "--ids", "9707,11,1879", "-n", "6", "--greedy", "--ignore-eos", "--print-ids")
    assert r2.stdout.decode().strip() == ids
    a = kiln("run", "-m", TINY, "--chat", "-p", "Why is the sky blue?", "-n", "8", "--temp", "0.8", "--seed", "7")
    b = kiln("run", "-m", TINY, "--chat", "-p", "Why is the sky blue?", "-n", "8", "--temp", "0.8", "--seed", "7")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and len(a.stdout.strip()) > 0, "same seed, same text"


def test_tokenize_round_trip():
    text = "Hello 世界! \n  code: x = f(1) 😀"
    r = kiln("tokenize", "-m", TINY, stdin=text.encode())
    assert r.returncode == 0, r.stderr
    ids = r.stdout.decode().strip()
    assert all(x.isdigit() for x in ids.split(","))
    d = kiln("tokenize", "-m", TINY, "--decode", stdin=ids.encode())
    assert d.returncode == 0, d.stderr
    assert d.stdout.decode() == text


def test_template_prints_only_the_rendering(tmp_path):
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": "Hi"}]))
    r = kiln("template", "-m", TINY, "--messages", str(msgs), "--add-generation-prompt", "--enable-thinking", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.mark.parametrize("args,needle", [
    (["run", "-m", "/nonexistent/model", "--ids", "1,2"], b"/nonexistent/model"),
    (["run", "-m", TINY, "--ids", "1,x,3"], b"bad token id list"),
    (["run", "-m", TINY, "--ids", "1", "--frobnicate"], b"unknown option"),
    (["logits", "-m", TINY, "--ids", "999999999", "--out", "/dev/null"], b"vocabulary"),
    (["inspect", "--dummy", "qwen3-9000b"], b"qwen3-9000b"),
])
def test_bad_input_is_a_clear_error(args, needle):
    r = kiln(*args)
    assert r.returncode != 0
    assert needle in r.stderr, r.stderr


@pytest.mark.parametrize("file,precision", [("micro-q4_0.gguf", "Q4_0"), ("micro-q8_0.gguf", "Q8_0"), ("micro-f16.gguf", "F16")])
def test_bench_names_the_checkpoint_weight_format(file, precision):
    """kiln bench labels a checkpoint by its weights' format, not by the
    config's dtype (a GGUF has none, which read as F32)."""
    path = os.path.join(FIX, "quant", "gguf", file)
    r = kiln("bench", "--profile", "pp-tg", "-m", path, "-t", "1", "-p", "8", "-n", "2", "-r", "1", "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    assert out["meta"]["precision"] == precision
    assert out["pp8"] > 0 and out["tg2"] > 0


def test_bench_depth_runs_each_test_after_a_cached_context():
    """-d (as llama-bench's): every pp and tg test again after d cached
    tokens, named "tg4 @ d48" in the table and tg4_d48 in the JSON; at depth
    the decode GB/s counts the KV cache read too, so it is above depth 0's
    for the same speed."""
    r = kiln("bench", "--profile", "pp-tg", "-m", TINY, "-t", "1", "-p", "8", "-n", "4", "-d", "0,48", "-r", "1",
             "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    tests = [row["test"] for row in out["rows"]]
    assert tests == ["pp8", "tg4", "pp8 @ d48", "tg4 @ d48"], tests
    for key in ("pp8", "tg4", "pp8_d48", "tg4_d48"):
        assert out[key] > 0, key
    assert out["tg4_d48_gbps"] / out["tg4_d48"] > out["tg4_gbps"] / out["tg4"]
    r = kiln("bench", "--profile", "speed", "-m", TINY, "-d", "64")
    assert r.returncode != 0 and b"-d belong to --profile pp-tg" in r.stderr


def test_bench_batch_chunk_holds_the_batch():
    """The batch profile's default prefill chunk is batch x the longest input
    (what --max-input leaves of it), at most 8,192 tokens, so a batch's
    prompts share forwards."""
    for extra, chunk in ((["--inputs", "256"], 1024), (["--inputs", "256", "--max-input", "300"], 1024),
                         (["--inputs", "4000", "--max-input", "1000"], 4000), (["--inputs", "1024,4096"], 8192)):
        r = kiln("bench", "--profile", "batch", "-m", TINY, "-t", "1", "--batches", "1,4", "--output-len", "2", "-r", "1",
                 "--max-total-tokens", "64", *extra)
        assert b"(chunk %d)" % chunk in r.stderr, (extra, r.stderr.decode())


def test_bench_tg_batch_decodes_sequences_together():
    """--tg-batch B: the tg tests decode B sequences at once ("tg4 @ b3",
    tg4_b3): t/s counts all B sequences' tokens, GB/s the weights once per
    step; with -d each sequence holds its own context, whose KV the GB/s
    counts B times."""
    r = kiln("bench", "--profile", "pp-tg", "-m", TINY, "-t", "1", "-p", "8", "-n", "4", "-d", "0,48", "-r", "1",
             "--tg-batch", "3", "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    assert [row["test"] for row in out["rows"]] == ["pp8", "tg4 @ b3", "pp8 @ d48", "tg4 @ d48 @ b3"]
    assert out["tg4_b3"] > 0 and out["tg4_d48_b3"] > 0 and "tg4" not in out
    # bytes per step: weights alone at depth 0, weights + 3 contexts' KV at depth 48
    assert out["tg4_d48_b3_gbps"] / out["tg4_d48_b3"] > out["tg4_b3_gbps"] / out["tg4_b3"]
    for bad in (["--profile", "batch"], ["--profile", "pp-tg", "--roofline"]):
        r = kiln("bench", *bad, "-m", TINY, "--tg-batch", "2")
        assert r.returncode != 0 and b"--tg-batch belongs to --profile pp-tg" in r.stderr
    r = kiln("bench", "--profile", "pp-tg", "-m", TINY, "--tg-batch", "0")
    assert r.returncode != 0
    # the default pool holds every sequence in whole pages: 20 x 18 tokens
    # are 360, but 20 x 2 pages of 16 are 640
    r = kiln("bench", "--profile", "pp-tg", "-m", TINY, "-t", "1", "-p", "8", "-n", "17", "-r", "1", "--tg-batch", "20",
             "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["tg17_b20"] > 0

