"""logit_bias, stop_token_ids, several prompts per completion, tool calls
and response_format, through the official openai client.

The fixture model has random weights and rather flat logits, so a bias of
+100 forces a token and -100 bans it: that is how these tests make the
output say what they need.
"""
import json
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from test_openai import PROMPTS, assert_openai_error, post  # noqa: E402

OPEN_BRACE, CLOSE_BRACE, QUOTE, COLON, COMMA = 90, 92, 1, 25, 11  # "{", "}", '"', ":", "," in Qwen's vocabulary
TOOL_CALL = 151657  # <tool_call>

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def token_ids(srv, text):
    status, _, body = post(srv.url, "/tokenize", {"prompt": text})
    assert status == 200, body
    return body["tokens"]


def detokenize(srv, ids):
    status, _, body = post(srv.url, "/detokenize", {"tokens": ids})
    assert status == 200, body
    return body["prompt"]


def greedy(client, model, prompt, n=8, **kw):
    return client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0, **kw)


# ==== logit_bias ====


def test_logit_bias_forces_and_bans(client, model, srv):
    hello = token_ids(srv, "Hello")
    assert len(hello) == 1
    r = greedy(client, model, PROMPTS[0], n=5, logit_bias={str(hello[0]): 100})
    assert r.choices[0].text == "Hello" * 5, "+100 forces the token at every step"
    # -100 on the greedy first token: another one comes first
    first = greedy(client, model, PROMPTS[0], n=1, logprobs=1)
    first_text = first.choices[0].logprobs.tokens[0]
    first_id = token_ids(srv, first_text)
    assert len(first_id) == 1 and detokenize(srv, first_id) == first_text
    banned = greedy(client, model, PROMPTS[0], n=1, logprobs=1, logit_bias={str(first_id[0]): -100})
    assert banned.choices[0].logprobs.tokens[0] != first_text
    # logprobs stay those of the raw logits: the banned token is still the most likely there
    assert banned.choices[0].logprobs.top_logprobs[0].get(first_text) is not None
    # chat and streaming too
    c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
                                       logit_bias={str(hello[0]): 100})
    assert c.choices[0].message.content == "Hello" * 4
    streamed = list(client.completions.create(model=model, prompt=PROMPTS[1], max_tokens=3, temperature=0, stream=True,
                                              logit_bias={str(hello[0]): 100}))
    assert "".join(ch.choices[0].text for ch in streamed) == "Hello" * 3
    # a small bias changes nothing under greedy when it does not overturn the order
    plain = greedy(client, model, PROMPTS[2], n=6).choices[0].text
    assert greedy(client, model, PROMPTS[2], n=6, logit_bias={"12345": 0.0}).choices[0].text == plain


def test_logit_bias_bad_input(srv, model):
    for bad in ({"abc": 1}, {"-1": 1}, {"1.5": 1}, {"": 1}, {"999999999": 1}, {"5": 101}, {"5": -100.5}, {"5": "x"}, {"5": None},
                [1, 2], "5:1"):
        s, _, b = post(srv.url, "/v1/completions", {"model": model, "prompt": "x", "max_tokens": 2, "logit_bias": bad})
        assert_openai_error(s, b, 400)
        assert b["error"]["param"] == "logit_bias", b
    s, _, b = post(srv.url, "/v1/completions", {"model": model, "prompt": "x", "max_tokens": 2, "logit_bias": {"5": -100, "7": 100}})
    assert s == 200, "still serving"


# ==== stop_token_ids ====


def test_stop_token_ids(client, model, srv):
    hello = token_ids(srv, "Hello")[0]
    # forced, then stopped at once: the stop token is counted but not returned
    r = greedy(client, model, PROMPTS[3], n=10, logit_bias={str(hello): 100}, extra_body={"stop_token_ids": [hello]})
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1
    # not before min_tokens (masked until then, like EOS)
    r = greedy(client, model, PROMPTS[3], n=10, logit_bias={str(hello): 100}, extra_body={"stop_token_ids": [hello], "min_tokens": 3})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 4
    assert "Hello" not in r.choices[0].text and r.choices[0].text
    # a natural stop: the k-th greedy token as the stop id cuts the text
    # before it (k: the first token, from the second on, that is new and
    # reads back as itself)
    def stop_candidate():
        for prompt in PROMPTS:
            toks = greedy(client, model, prompt, n=12, logprobs=0).choices[0].logprobs.tokens
            for k in range(1, len(toks)):
                ids = token_ids(srv, toks[k])
                if toks[k] not in toks[:k] and len(ids) == 1 and detokenize(srv, ids) == toks[k]:
                    return prompt, toks, k, ids
        pytest.fail("no greedy output has a suitable token")

    prompt, toks, k, ids = stop_candidate()
    for stream in (False, True):
        if stream:
            chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}, extra_body={"stop_token_ids": ids}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            used = chunks[-1].usage.completion_tokens
        else:
            r = greedy(client, model, prompt, n=12, extra_body={"stop_token_ids": ids})
            text, finish, used = r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
        assert text == "".join(toks[:k]) and finish == "stop" and used == k + 1, (stream, text, finish, used)
    # chat
    c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=10, temperature=0,
                                       logit_bias={str(hello): 100}, extra_body={"stop_token_ids": [hello]})
    assert c.choices[0].message.content == "" and c.choices[0].finish_reason == "stop"


def test_stop_token_ids_bad_input(srv, model):
    for bad in (5, [-1], [10**9], ["a"], [1.5], {"a": 1}):
        s, _, b = post(srv.url, "/v1/completions", {"model": model, "prompt": "x", "max_tokens": 2, "stop_token_ids": bad})
        assert_openai_error(s, b, 400)
        assert b["error"]["param"] == "stop_token_ids", b


# ==== several prompts in one completion ====


def test_several_prompts(client, model, srv):
    ids = token_ids(srv, PROMPTS[6])
    prompts = [PROMPTS[0], PROMPTS[5], ids]
    alone = [greedy(client, model, p, n=6) for p in prompts]
    r = client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0, n=2)
    assert [c.index for c in r.choices] == list(range(6)), "prompt i, sample j -> index i*n+j, in order"
    for i, a in enumerate(alone):
        for j in range(2):
            assert r.choices[i * 2 + j].text == a.choices[0].text, (i, j)
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone), "each prompt counted once"
    assert r.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # a list of token-id lists, streamed; seeded sampling: sample j of every prompt uses seed + j
    id_prompts = [token_ids(srv, p) for p in PROMPTS[:3]]
    kw = dict(model=model, max_tokens=6, temperature=1.0, seed=5, n=2)
    whole = client.completions.create(prompt=id_prompts, **kw)
    chunks = list(client.completions.create(prompt=id_prompts, stream=True, stream_options={"include_usage": True}, **kw))
    texts = {}
    finishes = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert sorted(texts) == list(range(6)) and sorted(finishes) == list(range(6))
    assert [texts[i] for i in range(6)] == [c.text for c in whole.choices], "streamed = whole, per index"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    for i, p in enumerate(id_prompts):
        single = client.completions.create(prompt=p, **kw)
        assert [c.text for c in single.choices] == [c.text for c in whole.choices[2 * i:2 * i + 2]], i
    # a single list of ints stays one prompt; ["text"] is one prompt too
    assert len(client.completions.create(model=model, prompt=ids, max_tokens=2).choices) == 1
    assert len(client.completions.create(model=model, prompt=[PROMPTS[0]], max_tokens=2).choices) == 1


def test_several_prompts_bad_input(srv, model):
    for bad in ([], ["a", 5], [["a"]], [[1, 2], [-1]], ["ok", ""], [[1], []], [{"text": "x"}]):
        s, _, b = post(srv.url, "/v1/completions", {"model": model, "prompt": bad, "max_tokens": 2})
        assert_openai_error(s, b, 400)
    s, _, b = post(srv.url, "/v1/completions", {"model": model, "prompt": ["x"] * 100, "n": 64, "max_tokens": 2})
    assert_openai_error(s, b, 400)
    with urllib.request.urlopen(srv.url + "/v1/models") as r:
        ctx = json.loads(r.read())["data"][0]["max_model_len"]
    s, _, b = post(srv.url, "/v1/completions", {"model": model, "prompt": [[5] * 10, [5] * (ctx + 1)], "max_tokens": 2})
    assert_openai_error(s, b, 400)
    assert "maximum context length" in b["error"]["message"]


# ==== tools ====


def test_tool_request_end_to_end(client, model, srv):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    # the tools reach the template
    _, _, with_tools = post(srv.url, "/tokenize", {"messages": msgs, "tools": [WEATHER_TOOL]})
    rendered = detokenize(srv, with_tools["tokens"])
    assert "<tools>" in rendered and '"name": "get_weather"' in rendered
    for choice in ("auto", "none"):
        r = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=8,
                                           temperature=0)
        assert r.choices[0].finish_reason == "length" and r.usage.prompt_tokens == with_tools["count"]
        assert r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str)
    # the model opens <tool_call> blocks (forced) but never closes one: no
    # tool call, the text comes back as content, streamed or not
    kw = dict(model=model, messages=msgs, tools=[WEATHER_TOOL], max_tokens=5, temperature=0, logit_bias={str(TOOL_CALL): 100})
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == "<tool_call>" * 5 and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "<tool_call>" * 5
    assert all(not d.tool_calls for d in deltas)
    # held back while it could still become a call: no content before the end
    assert all(not d.content for d in deltas[:-1] if d.content is not None), [d.content for d in deltas]


def test_tool_messages_in_the_prompt(client, model, srv):
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    status, _, tok = post(srv.url, "/tokenize", {"messages": msgs, "tools": [WEATHER_TOOL]})
    assert status == 200, tok
    text = detokenize(srv, tok["tokens"])
    # arguments sent as a JSON string reach the template as an object (Qwen's template prints it with tojson)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    r = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER_TOOL], max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == tok["count"] and r.usage.completion_tokens == 4
    # arguments that are not JSON are a 400
    bad = json.loads(json.dumps(msgs))
    bad[1]["tool_calls"][0]["function"]["arguments"] = "{city: Paris"
    s, _, b = post(srv.url, "/v1/chat/completions", {"model": model, "messages": bad})
    assert_openai_error(s, b, 400)


def test_tools_bad_input(srv, model):
    msgs = [{"role": "user", "content": "x"}]
    cases = [
        {"tools": {"type": "function"}},
        {"tools": [{"type": "function"}]},
        {"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
        {"tools": [{"type": "function", "function": {"name": ""}}]},
        {"tools": [WEATHER_TOOL], "tool_choice": "required"},
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"tools": [WEATHER_TOOL], "tool_choice": "sometimes"},
        {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}]},
    ]
    for extra in cases:
        s, _, b = post(srv.url, "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 2, **extra})
        assert_openai_error(s, b, 400)
    s, _, b = post(srv.url, "/v1/chat/completions", {"model": model, "messages": msgs, "tools": [WEATHER_TOOL],
                                                     "tool_choice": "required"})
    assert "not supported" in b["error"]["message"]


# ==== response_format ====


def is_json_object(text):
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def test_json_object(client, model):
    # forced to open and close at once: exactly "{}", and the request stops there
    json_mode = {"response_format": {"type": "json_object"}}  # completions: not in the client's signature
    r = greedy(client, model, PROMPTS[0], n=20, extra_body=json_mode, logit_bias={str(OPEN_BRACE): 100, str(CLOSE_BRACE): 100})
    assert r.choices[0].text == "{}" and r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 2
    # sampled, nudged towards structure: every answer that ends is one JSON object
    bias = {str(QUOTE): 9, str(CLOSE_BRACE): 7, str(COLON): 5, str(COMMA): 5}
    closed = 0
    for seed in range(12):
        c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "JSON please"}], max_tokens=48,
                                           temperature=1.0, seed=seed, response_format={"type": "json_object"}, logit_bias=bias)
        text = c.choices[0].message.content
        assert text.startswith("{"), text
        if c.choices[0].finish_reason == "stop":
            closed += 1
            assert is_json_object(text), text
        else:
            assert c.choices[0].finish_reason == "length" and not is_json_object(text)
    assert closed >= 4, f"only {closed} of 12 objects closed"
    # streaming gives the same text
    kw = dict(model=model, prompt=PROMPTS[1], max_tokens=48, temperature=1.0, seed=3, extra_body=json_mode, logit_bias=bias)
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    # unconstrained greedy text is not JSON; constrained greedy text starts an object
    assert not greedy(client, model, PROMPTS[2], n=10).choices[0].text.startswith("{")
    assert greedy(client, model, PROMPTS[2], n=10, extra_body=json_mode).choices[0].text.startswith("{")


def test_response_format_other_types(client, model, srv):
    plain = greedy(client, model, PROMPTS[3], n=6).choices[0].text
    assert greedy(client, model, PROMPTS[3], n=6, extra_body={"response_format": {"type": "text"}}).choices[0].text == plain
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="json_schema.*not supported"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], response_format=schema)
    for bad in ({"type": "xml"}, {"type": 5}, "json", {}):
        s, _, b = post(srv.url, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "x"}],
                                                         "response_format": bad})
        assert_openai_error(s, b, 400)
        assert b["error"]["param"] == "response_format"


# ==== echo, and the fields kiln refuses rather than ignores ====


def test_echo(client, model, srv):
    prompt = PROMPTS[0]
    plain = greedy(client, model, prompt, n=6).choices[0].text
    r = greedy(client, model, prompt, n=6, echo=True)
    assert r.choices[0].text == prompt + plain
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens == len(token_ids(srv, prompt))
    # streamed: the prompt is each choice's first chunk, then the same tokens
    chunks = list(greedy(client, model, prompt, n=6, echo=True, stream=True))
    assert chunks[0].choices[0].text == prompt
    assert "".join(c.choices[0].text for c in chunks) == prompt + plain
    # token-id prompts echo as their decoded text, one per prompt and choice
    ids = [token_ids(srv, PROMPTS[1]), token_ids(srv, PROMPTS[2])]
    r = greedy(client, model, ids, n=3, echo=True, extra_body={"n": 2})
    assert len(r.choices) == 4
    for i, ch in enumerate(r.choices):
        want = detokenize(srv, ids[i // 2])
        assert ch.text.startswith(want) and len(ch.text) > len(want), (i, ch.text)
    with pytest.raises(openai.BadRequestError, match="'echo' with 'logprobs'"):
        greedy(client, model, prompt, echo=True, logprobs=2)


def test_unsupported_fields_are_refused(client, model, srv):
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError, match="'suffix' is not supported"):
        greedy(client, model, PROMPTS[0], suffix="end")
    assert greedy(client, model, PROMPTS[0], n=3, suffix="").choices[0].text == greedy(client, model, PROMPTS[0], n=3).choices[0].text
    with pytest.raises(openai.BadRequestError, match="'best_of' other than n"):
        greedy(client, model, PROMPTS[0], best_of=3)
    assert len(greedy(client, model, PROMPTS[0], n=2, best_of=2, extra_body={"n": 2}).choices) == 2
    with pytest.raises(openai.BadRequestError, match="audio output is not supported"):
        client.chat.completions.create(model=model, messages=msgs, max_tokens=2, modalities=["text", "audio"],
                                       audio={"voice": "alloy", "format": "wav"})
    with pytest.raises(openai.BadRequestError, match="only the 'text' modality"):
        client.chat.completions.create(model=model, messages=msgs, max_tokens=2, modalities=["audio"])
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=2, modalities=["text"])
    assert r.usage.completion_tokens == 2


# ==== add_generation_prompt / continue_final_message (vLLM's extra chat fields) ====

# transformers' apply_chat_template(..., continue_final_message=True) on the
# fixture's template (transformers 5.25.0, 2026-12-06): the last assistant
# message is left open, cut after its text (trailing whitespace kept where the
# template kept it, leading whitespace outside the cut)
CONTINUED = [
    ("Sure", "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nSure"),
    ("Sure \n", "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nSure \n"),
    (" lead", "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n lead"),
]


def rendered(srv, body):
    status, _, b = post(srv.url, "/tokenize", body)
    assert status == 200, b
    return detokenize(srv, b["tokens"])


def test_continue_final_message(client, model, srv):
    for text, want in CONTINUED:
        msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": text}]
        assert rendered(srv, {"messages": msgs, "continue_final_message": True}) == want
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "Sure"}]
    closed = rendered(srv, {"messages": msgs})
    assert closed == CONTINUED[0][1] + "<|im_end|>\n<|im_start|>assistant\n"
    assert rendered(srv, {"messages": msgs[:1], "add_generation_prompt": False}) == "<|im_start|>user\na<|im_end|>\n"
    # through the chat route: the prompt is the open message, and the reply continues it
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, temperature=0,
                                       extra_body={"continue_final_message": True})
    assert r.usage.prompt_tokens == len(token_ids(srv, CONTINUED[0][1])) and r.usage.completion_tokens == 3
    plain = greedy(client, model, CONTINUED[0][1], n=3).choices[0].text
    assert r.choices[0].message.content == plain
    for body, match in (
        ({"messages": msgs, "continue_final_message": True, "add_generation_prompt": True}, "cannot both be true"),
        ({"messages": msgs[:1], "continue_final_message": True}, "last message to be the assistant's"),
        ({"messages": [msgs[0], {"role": "assistant", "content": "  "}], "continue_final_message": True}, "does not appear"),
        ({"messages": msgs, "continue_final_message": "yes"}, "must be a boolean"),
    ):
        s, _, b = post(srv.url, "/v1/chat/completions", {"model": model, "max_tokens": 2, **body})
        assert_openai_error(s, b, 400)
        assert match in b["error"]["message"], b


# ==== usage.completion_tokens_details.reasoning_tokens ====

THINK_OPEN, THINK_CLOSE = 151667, 151668  # <think>, </think>


def test_reasoning_tokens(client, model, srv):
    """A thinking model's chat usage counts the completion tokens from <think>
    (or a prompt that opened it) through </think>, both tags included; the
    fixture's flat logits let a +100 bias force a tag."""
    msgs = [{"role": "user", "content": "a"}]

    def usage(bias, stream=False, **kw):
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, logit_bias=bias, stream=stream,
                                           stream_options={"include_usage": True} if stream else None, **kw)
        return list(r)[-1].usage if stream else r.usage

    u = usage({str(THINK_OPEN): 100})  # <think> <think> <think>: all reasoning
    assert u.completion_tokens == 3 and u.completion_tokens_details.reasoning_tokens == 3, u
    assert usage({str(THINK_OPEN): 100}, stream=True).completion_tokens_details.reasoning_tokens == 3
    u = usage({str(THINK_CLOSE): 100})  # never opened: none
    assert u.completion_tokens == 3 and u.completion_tokens_details.reasoning_tokens == 0, u
    # with thinking off the template closes an empty <think> block in the prompt
    u = usage({str(THINK_OPEN): 100}, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert u.completion_tokens_details.reasoning_tokens == 3, u  # a <think> the model writes itself still counts
    # completions carry no reasoning count
    r = client.completions.create(model=model, prompt="a", max_tokens=2)
    assert r.usage.completion_tokens_details is None
