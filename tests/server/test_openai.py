"""kiln serve through the official openai client (and raw HTTP where the
client cannot say it: malformed JSON, oversized bodies, dropped clients).

The model has random weights, so outputs are gibberish, but greedy outputs
are deterministic: that is what the equalities below rely on.
"""
import concurrent.futures as cf
import http.client
import json
import socket
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from conftest import Server  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "In 1492, Columbus",
    "The quick brown fox",
    "Translate to German: good morning",
]


def post(url, path, body, headers=None, raw=None):
    """POST JSON (or raw bytes); returns (status, headers, parsed body or text)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, hdrs, text = r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, dict(e.headers), e.read().decode()
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def assert_openai_error(status, body, code):
    assert status == code, body
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    assert body["error"]["message"] and body["error"]["type"], body


def greedy_completion(client, model, prompt, n=12, **kw):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0, **kw)
    return r.choices[0].text, r


def chat(client, model, text, **kw):
    kw.setdefault("max_tokens", 12)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], **kw)


# ==== routes and shapes ====


def test_models(client, srv):
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == "qwen3-dense-tiny"
    m = client.models.retrieve("qwen3-dense-tiny")
    assert m.id == "qwen3-dense-tiny" and m.object == "model" and m.model_extra["max_model_len"] == models[0].model_extra["max_model_len"] > 0
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("Qwen/other")


def test_completion(client, model):
    text, r = greedy_completion(client, model, PROMPTS[0], n=10)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 10
    assert isinstance(text, str) and text


def test_completion_token_ids_prompt(client, model, srv):
    status, _, tok = post(srv.url, "/tokenize", {"prompt": PROMPTS[1]})
    assert status == 200 and tok["count"] == len(tok["tokens"])
    by_text, _ = greedy_completion(client, model, PROMPTS[1])
    by_ids, _ = greedy_completion(client, model, tok["tokens"])
    assert by_text == by_ids
    status, _, de = post(srv.url, "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and de["prompt"] == PROMPTS[1]


def test_chat(client, model):
    r = chat(client, model, "Hello!")
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    m = r.choices[0].message
    assert m.role == "assistant" and isinstance(m.content, str)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12


def test_chat_stream_framing(client, model):
    full = chat(client, model, "Tell me a story.", max_tokens=16)
    chunks = list(chat(client, model, "Tell me a story.", max_tokens=16, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant", "role comes first"
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[-1].choices[0].finish_reason == "length", "finish_reason comes last"
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 16, "then the usage chunk"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in with_choices)
    assert text == (full.choices[0].message.content or "")
    assert reasoning == (getattr(full.choices[0].message, "reasoning_content", None) or "")
    assert len({c.id for c in chunks}) == 1
    assert all(c.usage is None for c in with_choices), "usage only in the last chunk unless asked for continuously"
    # continuous_usage_stats (vLLM): every chunk carries the usage so far, the
    # completion count rising to the final usage (by one per chunk unless a
    # token adds no text, e.g. half of a UTF-8 character)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(chat(client, model, "Tell me a story.", max_tokens=8, stream=True, stream_options=opts))
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts[0] == 0 and counts[-1] == 8 and all(a <= b for a, b in zip(counts, counts[1:])) and len(set(counts)) > 4, counts
    assert len({c.usage.prompt_tokens for c in chunks}) == 1 and all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)


def test_completion_stream_equals_non_stream(client, model, srv):
    text, _ = greedy_completion(client, model, PROMPTS[2], n=20)
    chunks = list(client.completions.create(model=model, prompt=PROMPTS[2], max_tokens=20, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    # and the raw SSE ends with [DONE]
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": PROMPTS[2], "max_tokens": 3, "stream": True}),
                 {"Content-Type": "application/json"})
    body = conn.getresponse().read().decode()
    assert body.rstrip().endswith("data: [DONE]") and body.startswith("data: {")


def test_n_choices(client, model):
    r = client.completions.create(model=model, prompt=PROMPTS[3], max_tokens=8, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) == 1, "greedy choices agree"
    assert r.usage.completion_tokens == 24
    r = chat(client, model, "Pick a number", temperature=1.0, seed=7, n=4, max_tokens=8)
    assert len(r.choices) == 4
    stream = list(chat(client, model, "Pick a number", temperature=1.0, seed=7, n=4, max_tokens=8, stream=True))
    texts = ["".join(c.choices[0].delta.content or "" for c in stream if c.choices and c.choices[0].index == i) for i in range(4)]
    assert texts == [c.message.content for c in r.choices], "seeded choices repeat, streaming or not"


def test_seeds(client, model):
    kw = dict(model=model, prompt=PROMPTS[4], max_tokens=16, temperature=1.0, top_p=0.95, extra_body={"top_k": 50})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    c = client.completions.create(seed=99, **kw).choices[0].text
    assert a == b
    assert a != c


def test_sampling_parameters_accepted(client, model):
    r = client.completions.create(model=model, prompt=PROMPTS[5], max_tokens=6, temperature=0.7, top_p=0.9, seed=3,
                                  presence_penalty=0.5, frequency_penalty=0.5,
                                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
    assert r.usage.completion_tokens == 6


def test_stop_strings(client, model):
    full, _ = greedy_completion(client, model, PROMPTS[6], n=24)
    assert len(full) > 12
    # a stop string that starts in the middle of the output (probably
    # spanning token boundaries)
    stop = full[5:9]
    cut = full[: full.index(stop)]
    r = client.completions.create(model=model, prompt=PROMPTS[6], max_tokens=24, temperature=0, stop=[stop, "never-there"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=model, prompt=PROMPTS[6], max_tokens=24, temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == cut
    assert streamed[-1].choices[0].finish_reason == "stop"
    # chat too
    fullc = chat(client, model, "Stop here", max_tokens=24).choices[0].message.content
    if len(fullc) > 8:
        s = fullc[3:6]
        rc = chat(client, model, "Stop here", max_tokens=24, stop=s)
        assert rc.choices[0].message.content == fullc[: fullc.index(s)] and rc.choices[0].finish_reason == "stop"


def test_ignore_eos_and_min_tokens(client, model):
    r = client.completions.create(model=model, prompt=PROMPTS[7], max_tokens=30, temperature=0,
                                  extra_body={"ignore_eos": True, "min_tokens": 30})
    assert r.usage.completion_tokens == 30 and r.choices[0].finish_reason == "length"


def test_logprobs(client, model):
    r = chat(client, model, "Count", max_tokens=6, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == 6
    for e in lp:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert e.token == e.top_logprobs[0].token, "greedy picks the most likely"
        assert abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5
    c = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=5, temperature=0, logprobs=2)
    l2 = c.choices[0].logprobs
    assert len(l2.tokens) == len(l2.token_logprobs) == len(l2.top_logprobs) == len(l2.text_offset) == 5
    assert "".join(l2.tokens) == c.choices[0].text
    assert all(len(t) <= 2 for t in l2.top_logprobs)


def test_thinking_switch(srv):
    msgs = [{"role": "user", "content": "hi"}]
    _, _, on = post(srv.url, "/tokenize", {"messages": msgs})
    _, _, off = post(srv.url, "/tokenize", {"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}})
    _, _, txt = post(srv.url, "/detokenize", {"tokens": off["tokens"]})
    assert off["count"] > on["count"] and "<think>" in txt["prompt"] and "</think>" in txt["prompt"]


def test_health_and_metrics(srv):
    with urllib.request.urlopen(srv.url + "/health", timeout=60) as r:
        assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    m = srv.metrics()
    for k in ("kiln_kv_pages_total", "kiln_kv_pages_used", "kiln_num_requests_running", "kiln_num_requests_waiting",
              "kiln_prefix_cache_hit_rate", "kiln_time_to_first_token_seconds_count", "kiln_time_per_output_token_seconds_count",
              "kiln_generation_tokens_total", "kiln_prompt_tokens_total"):
        assert k in m, k


# ==== batching and the prefix cache ====


def wait_idle(srv, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = srv.metrics()
        if m["kiln_num_requests_running"] == 0 and m["kiln_num_requests_waiting"] == 0 and m["kiln_kv_pages_held"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"server not idle: {m}")


def test_concurrent_equals_sequential(client, model):
    reqs = [(p, 8 + 3 * i) for i, p in enumerate(PROMPTS)] * 2
    seq = [greedy_completion(client, model, p, n)[0] for p, n in reqs]
    with cf.ThreadPoolExecutor(len(reqs)) as ex:
        conc = list(ex.map(lambda a: greedy_completion(client, model, a[0], a[1])[0], reqs))
    assert conc == seq
    # chat, streamed, concurrently
    def streamed(p):
        return "".join(c.choices[0].delta.content or "" for c in chat(client, model, p, max_tokens=10, stream=True) if c.choices)
    seqc = [chat(client, model, p, max_tokens=10).choices[0].message.content for p in PROMPTS]
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        assert list(ex.map(streamed, PROMPTS)) == seqc


def test_prefix_cache_hit(client, model, srv):
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer precisely and briefly." for i in range(60))
    msgs = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]  # noqa: E731
    wait_idle(srv)
    post(srv.url, "/flush_cache", {})
    first = client.chat.completions.create(model=model, messages=msgs("What is 2+2?"), max_tokens=10, temperature=0)
    assert first.usage.prompt_tokens > 400
    m0 = srv.metrics()
    again = client.chat.completions.create(model=model, messages=msgs("What is 2+2?"), max_tokens=10, temperature=0)
    other = client.chat.completions.create(model=model, messages=msgs("Name a color."), max_tokens=10, temperature=0)
    m1 = srv.metrics()
    assert again.choices[0].message.content == first.choices[0].message.content, "a cache hit changes no output"
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    assert other.usage.prompt_tokens_details.cached_tokens >= 400, "the shared system prompt is reused"
    assert m1["kiln_prefix_cache_hits_total"] - m0["kiln_prefix_cache_hits_total"] >= 800
    assert m1["kiln_prefix_cache_hit_rate"] > 0
    # the same question after a flush: computed from scratch, same answer
    post(srv.url, "/flush_cache", {})
    cold = client.chat.completions.create(model=model, messages=msgs("Name a color."), max_tokens=10, temperature=0)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.choices[0].message.content == other.choices[0].message.content


# ==== bad input ====


def test_bad_json_and_types(srv, client, model):
    u = srv.url
    s, _, b = post(u, "/v1/chat/completions", None, raw=b'{"messages": [')
    assert_openai_error(s, b, 400)
    s, _, b = post(u, "/v1/completions", None, raw=b"[1, 2]")
    assert_openai_error(s, b, 400)
    cases = [
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
        ("/v1/completions", {"prompt": "x", "n": 0}),
        ("/v1/completions", {"prompt": "x", "top_p": 0}),
        ("/v1/completions", {"prompt": "x", "stop": 5}),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}),
        ("/v1/completions", {"prompt": "x", "logprobs": 99}),
        ("/v1/completions", {"prompt": 42}),
        ("/v1/completions", {"prompt": [1, -5]}),
        ("/v1/completions", {"prompt": [1, 10**9]}),
        ("/v1/completions", {"prompt": [1, 2], "max_tokens": "x"}),
        ("/v1/completions", {"prompt": [1, 2.5]}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 5, "min_tokens": 9}),
        ("/v1/completions", {"prompt": ""}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/chat/completions", {"messages": "hello"}),
        ("/v1/chat/completions", {"messages": [{"content": "no role"}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "no"}}),
    ]
    for path, body in cases:
        s, _, b = post(u, path, {"model": model, **body})
        assert_openai_error(s, b, 400)
    # content parts: text parts are joined; any other kind is refused by name
    # (no image encoder), and so are malformed parts
    r = client.chat.completions.create(
        model=model, max_tokens=2, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": " there"}]}]
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    for content in ([{"type": "text", "text": "look"}, image], [{"type": "text"}], ["hi"], [{"text": "hi"}]):
        s, _, b = post(u, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": content}]})
        assert_openai_error(s, b, 400)
        msg = b["error"]["message"]
        assert msg.startswith("messages[0]: ") and "template" not in msg, msg
        if content[-1] is image:
            assert "'image_url' are not supported" in msg, msg
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.post("/nowhere", cast_to=object, body={})


def test_too_long(client, model, srv):
    with urllib.request.urlopen(srv.url + "/v1/models") as r:
        ctx = json.loads(r.read())["data"][0]["max_model_len"]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=model, prompt=[5] * (ctx + 10), max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=model, prompt=[5] * 100, max_tokens=ctx)
    assert greedy_completion(client, model, PROMPTS[0], n=2)[1].usage.completion_tokens == 2, "still serving"


def test_client_disconnect_aborts(srv, model):
    wait_idle(srv)
    before = srv.metrics()
    body = json.dumps({"model": model, "prompt": "Go on forever", "max_tokens": 3000, "ignore_eos": True, "stream": True}).encode()
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data:") < 3:
            got += sock.recv(4096)
        sock.close()
    # non-streaming too: the handler polls the socket while it waits
    sock = socket.create_connection(("127.0.0.1", srv.port))
    body2 = json.dumps({"model": model, "prompt": "Go on", "max_tokens": 3000, "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body2)).encode() + b"\r\n\r\n" + body2)
    time.sleep(0.3)
    sock.close()
    m = wait_idle(srv, timeout=20)
    assert m['kiln_requests_total{finish="abort"}'] - before['kiln_requests_total{finish="abort"}'] >= 4
    assert m["kiln_generation_tokens_total"] - before["kiln_generation_tokens_total"] < 4 * 3000


# ==== auth, body limit, overload: a second, strict server ====


@pytest.fixture(scope="module")
def strict():
    s = Server("--api-key", "sekret", "--max-body-bytes", "4096", "--max-running-requests", "1", "--max-queued-requests", "1",
               "--max-total-tokens", "2048")
    yield s
    s.stop()


def test_api_key(strict):
    ok = openai.OpenAI(base_url=strict.url + "/v1", api_key="sekret", max_retries=0)
    bad = openai.OpenAI(base_url=strict.url + "/v1", api_key="wrong", max_retries=0)
    assert ok.models.list().data
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="qwen3-dense-tiny", prompt="x", max_tokens=2)
    s, h, b = post(strict.url, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert_openai_error(s, b, 401)
    s, h, b = post(strict.url, "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"Authorization": "Bearer sekret"})
    assert s == 200
    with urllib.request.urlopen(strict.url + "/health", timeout=60) as r:
        assert r.status == 200, "health needs no key"


def test_body_limit(strict):
    big = {"prompt": "x" * 10000, "max_tokens": 2}
    s, _, b = post(strict.url, "/v1/completions", big, headers={"Authorization": "Bearer sekret"})
    assert_openai_error(s, b, 413)
    # chunked upload without Content-Length
    conn = http.client.HTTPConnection("127.0.0.1", strict.port, timeout=30)
    conn.request("POST", "/v1/completions", body=iter([b'{"prompt": "' + b"y" * 3000, b"z" * 3000 + b'"}']),
                 headers={"Content-Type": "application/json", "Authorization": "Bearer sekret"}, encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 413 and "error" in json.loads(r.read())
    s, _, b = post(strict.url, "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"Authorization": "Bearer sekret"})
    assert s == 200, "still serving"


def test_queue_full(strict):
    hdr = {"Authorization": "Bearer sekret"}
    body = {"prompt": "Busy busy", "max_tokens": 150, "ignore_eos": True}
    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda _: post(strict.url, "/v1/completions", body, headers=hdr), range(8)))
    codes = sorted(r[0] for r in results)
    assert 200 in codes and 503 in codes, codes
    assert set(codes) <= {200, 503}
    for s, h, b in results:
        if s == 503:
            assert_openai_error(s, b, 503)
            assert int(h.get("Retry-After", 0)) >= 1
        else:
            assert b["usage"]["completion_tokens"] == 150
    client = openai.OpenAI(base_url=strict.url + "/v1", api_key="sekret", max_retries=0)
    assert client.completions.create(model="qwen3-dense-tiny", prompt="x", max_tokens=2).usage.completion_tokens == 2


# ==== soak ====


def soak_round(client, model, n, conc, seed):
    def one(i):
        p = PROMPTS[i % len(PROMPTS)] + f" #{(i * 7919 + seed) % 97}"
        kind = i % 4
        if kind == 0:
            r = client.completions.create(model=model, prompt=p, max_tokens=8, temperature=0)
            return r.usage.completion_tokens
        if kind == 1:
            r = chat(client, model, p, max_tokens=8, temperature=0.8, seed=i)
            return r.usage.completion_tokens
        if kind == 2:
            n_tok = 0
            for c in client.completions.create(model=model, prompt=p, max_tokens=8, stream=True,
                                               stream_options={"include_usage": True}):
                if c.usage:
                    n_tok = c.usage.completion_tokens
            return n_tok
        r = chat(client, model, p, max_tokens=8, stop=["e"], n=2)
        return r.usage.completion_tokens

    with cf.ThreadPoolExecutor(conc) as ex:
        return list(ex.map(one, range(n)))


def test_soak(srv, client, model):
    """500 mixed requests at concurrency 32, twice: no error, every page
    back (free or evictable cache) after each round, resident memory flat
    between the rounds."""
    got = soak_round(client, model, 500, 32, 1)
    assert all(g > 0 for g in got)
    m = wait_idle(srv)
    assert m["kiln_kv_pages_used"] == m["kiln_kv_pages_cached"] == m["kiln_kv_pages_evictable"], m
    rss1 = srv.rss_kib()
    got = soak_round(client, model, 500, 32, 2)
    assert all(g > 0 for g in got)
    m = wait_idle(srv)
    rss2 = srv.rss_kib()
    assert rss2 - rss1 < max(8192, rss1 // 10), f"RSS grew from {rss1} to {rss2} KiB"
    post(srv.url, "/flush_cache", {})
    m = srv.metrics()
    assert m["kiln_kv_pages_used"] == 0, "every page free after a cache flush"
    assert m['kiln_requests_total{finish="error"}'] == 0
    assert srv.alive()


def test_int8_kv_cache(model):
    """`--kv-dtype q8_0`: the cache rows are quantized once, when written, and
    a row's quantization depends on that row alone, so continuous batching
    (several sequences in one attention call) and the prefix cache serve the
    same greedy outputs as requests one at a time."""
    s = Server("--kv-dtype", "q8_0", "--max-total-tokens", "4096")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reqs = [(p, 8 + 3 * i) for i, p in enumerate(PROMPTS)]
        seq = [greedy_completion(c, model, p, n)[0] for p, n in reqs]
        assert all(seq), seq
        with cf.ThreadPoolExecutor(len(reqs)) as ex:
            conc = list(ex.map(lambda a: greedy_completion(c, model, a[0], a[1])[0], reqs))
        assert conc == seq
        assert [greedy_completion(c, model, p, n)[0] for p, n in reqs] == seq  # cached prefixes now
        assert "KV cache of 4096 tokens in Q8_0 rows" in s.read_log()
        assert s.alive()
    finally:
        s.stop()
