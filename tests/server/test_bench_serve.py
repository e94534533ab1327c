"""kiln bench serve against kiln serve, end to end (no timing assertions).

Starts `kiln serve` on the qwen3-dense-tiny fixture (its Qwen3 tokenizer makes
tokens stream one chunk each; conftest.Server), then runs the prefix
profile and the serving mode of `kiln bench serve` and checks the JSON:
the rows asked for, exact output lengths, positive figures.

The kiln binary: $KILN (default build/kiln).
"""
import json
import os
import subprocess

import pytest

from conftest import KILN, Server, free_port


@pytest.fixture(scope="module")
def server():
    s = Server("--max-total-tokens", "4096")
    yield s.url
    s.stop()


def _bench(*args):
    r = subprocess.run([KILN, "bench", "serve", *args, "--format", "json", "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_prefix_profile(server):
    url = server
    j = _bench("--url", url, "--profile", "prefix", "--inputs", "40,300", "--output-len", "4", "-r", "2",
               "--token-range", "1000")
    assert j["profile"] == "prefix" and j["meta"]["model"] == "qwen3-dense-tiny"
    rows = j["rows"]
    # 40 and 300 without prefix, then 300 = 50 cached + 250 new
    assert [(r["input_tokens"], r["prefix_tokens"], r["prefill_len"]) for r in rows] == [(40, 0, 40), (300, 0, 300), (300, 50, 250)]
    for r in rows:
        assert r["measured_output"] == 4  # ignore_eos + min_tokens: exact
        assert r["ttft_ms"] > 0 and r["prefill_tps"] > 0
        assert r["tpot_ms"] > 0 and r["decode_tps"] > 0
        assert r["profile"] == f'{r["prefill_len"]}:{r["input_tokens"]}'


def test_serving_mode(server):
    url = server
    j = _bench("--url", url, "--profile", "serving", "--num-prompts", "6", "--input-len", "32", "--output-len", "5",
               "--max-concurrency", "2", "--request-rate", "20", "--token-range", "1000")
    assert j["profile"] == "serving"
    assert j["completed"] == 6 and j["failed"] == 0
    assert j["total_input_tokens"] == 6 * 32 and j["total_output_tokens"] == 6 * 5
    for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_e2e_latency_ms", "request_throughput",
              "output_throughput", "total_token_throughput"):
        assert j[k] > 0, k
    assert j["mean_tpot_ms"] > 0 and j["mean_itl_ms"] > 0
    assert j["p99_ttft_ms"] >= j["median_ttft_ms"]


def test_unreachable_server():
    if not os.path.exists(KILN):
        pytest.skip(f"{KILN} not built")
    r = subprocess.run([KILN, "bench", "serve", "--url", f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "connect" in r.stderr
