"""The HTTP layer of `eyas serve` in-process (httpx's ASGI transport) over the real served stack: the demo
target with a draft (k=3) behind the engine thread, as `eyas serve` builds it. Stop strings cut the
greedy text at their first occurrence, whole and streamed, in both endpoints (a non-streamed request
that reaches a stop string answers instead of waiting for an engine event that never comes); length
and usage count the real tokens; every response carries vLLM's keys in vLLM's order, with SGLang's
verify counts only when asked; errors get vLLM's bodies; `eyas serve` takes its dotted overrides
before or after the options."""

import asyncio
import json

import httpx
import pytest
from tiny_targets import draft_for

from eyas.data.chat import render_prompt
from eyas.data.target import load_target
from eyas.recipes.load import load_recipe
from eyas.recipes.types import TreeShape
from eyas.serve.api.server import build_app, build_served, parse_args
from eyas.serve.api.serving import Served
from eyas.serve.decoding.reference import greedy_generate
from eyas.train.checkpoint import save_draft

K = 3
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "What is 7 plus 5?"}]
MAX = 160  # the greedy completion ends (eos) before this (the demo target answers within 160)
CHAT_MAX = 160  # the greedy chat reasons, answers and ends (eos) before this
TIMEOUT = 60  # seconds: a request still unanswered by then hangs
ABSENT = "zebra crossing"


class Stack:
    """The served demo target, its app, and the one event loop every request runs on (as a server's)."""

    def __init__(self, served: Served, loop: asyncio.AbstractEventLoop):
        self.served, self.app, self.loop = served, build_app(served), loop
        self.tok = served.tokenizer

    def request(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        async def go():
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                return await asyncio.wait_for(c.request(method, path, json=body), TIMEOUT)

        return self.loop.run_until_complete(go())

    def post(self, path: str, body: dict) -> httpx.Response:
        return self.request("POST", path, body)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Built once: a random draft for the demo target saved, then `eyas serve`'s stack over it (k=3, 8 rows);
    the engine thread is stopped at the end."""
    model, _ = load_target("eyas-demo", "float32", "cpu")
    draft_dir = tmp_path_factory.mktemp("serve_api") / "draft"
    save_draft(draft_for(model, 0, aux_ids=[1, 2, 3]), draft_dir)
    del model
    recipe = load_recipe("demo", ["target.dtype=float32", "target.device=cpu"])
    served = build_served(recipe, str(draft_dir), TreeShape.chain(K), None, 8, None, speculate=True)
    loop = asyncio.new_event_loop()
    try:
        yield Stack(served, loop)
    finally:
        served.runner.stop()
        loop.close()


@pytest.fixture(scope="module")
def greedy_completion(stack):
    """The completion of PROMPT without stop strings (temperature 0)."""
    body = {"prompt": PROMPT, "max_tokens": MAX, "temperature": 0, "return_token_ids": True}
    return stack.post("/v1/completions", body).json()


@pytest.fixture(scope="module")
def greedy_chat(stack):
    """The chat answer to MESSAGES without stop strings (temperature 0)."""
    body = {"messages": MESSAGES, "max_tokens": CHAT_MAX, "temperature": 0, "return_token_ids": True}
    return stack.post("/v1/chat/completions", body).json()


def events(r: httpx.Response) -> list[dict]:
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def stop_case(text: str, case: str) -> tuple[str | list[str], str, str | None]:
    """For a greedy `text`: the request's `stop` for `case`, the text cut at it, and the stop_reason.
    early: a string a quarter in; pair: [the last 3 characters that first occur after the early string,
    the early one] (the later-listed one occurs first); absent: a string not in the text (it runs to
    its end)."""
    early = text[len(text) // 4 : len(text) // 4 + 3]
    cut = text[: text.find(early)]
    assert cut, text
    if case == "early":
        return early, cut, early
    if case == "pair":
        ends = (text[i - 3 : i] for i in range(len(text), 3, -1))
        later = next(x for x in ends if text.find(x) > text.find(early))
        return [later, early], cut, early
    assert ABSENT not in text
    return ABSENT, text, None


def assert_streamed(streamed: str, text: str, stop_reason: str | None) -> None:
    """Streamed deltas are not held back while they could begin a stop string: the streamed text is the
    cut text and at most a proper prefix of the stop string beyond it."""
    assert streamed.startswith(text)
    assert len(streamed) <= len(text) + max(len(stop_reason or "") - 1, 0)


@pytest.mark.parametrize("case", ["early", "pair", "absent"])
def test_completion_stop_strings_whole_and_streamed(stack, greedy_completion, case):
    greedy = greedy_completion["choices"][0]
    assert greedy["finish_reason"] == "stop"  # eos: without a stop string the text runs to its end
    stop, text, stop_reason = stop_case(greedy["text"], case)
    body = {"prompt": PROMPT, "max_tokens": MAX, "temperature": 0, "stop": stop}
    whole = stack.post("/v1/completions", body).json()["choices"][0]
    assert whole["text"] == text and whole["finish_reason"] == "stop" and whole["stop_reason"] == stop_reason
    chunks = events(stack.post("/v1/completions", {**body, "stream": True}))
    assert_streamed("".join(c["choices"][0]["text"] for c in chunks), text, stop_reason)
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "stop" and last["stop_reason"] == stop_reason


@pytest.mark.parametrize("case", ["early", "pair", "absent"])
def test_chat_stop_strings_whole_and_streamed(stack, greedy_chat, case):
    greedy = greedy_chat["choices"][0]
    assert greedy["finish_reason"] == "stop"  # eos: without a stop string the content runs to its end
    stop, text, stop_reason = stop_case(greedy["message"]["content"], case)
    body = {"messages": MESSAGES, "max_tokens": CHAT_MAX, "temperature": 0, "stop": stop}
    whole = stack.post("/v1/chat/completions", body).json()["choices"][0]
    assert whole["message"]["content"] == text
    # stop strings cut the content only: the reasoning before it is the greedy one
    assert whole["message"]["reasoning_content"] == greedy["message"]["reasoning_content"]
    assert whole["finish_reason"] == "stop" and whole["stop_reason"] == stop_reason
    chunks = events(stack.post("/v1/chat/completions", {**body, "stream": True}))
    assert_streamed("".join(c["choices"][0]["delta"].get("content", "") for c in chunks), text, stop_reason)
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "stop" and last["stop_reason"] == stop_reason


def test_length_and_usage(stack, greedy_completion):
    prompt_ids = stack.tok.encode(PROMPT)
    greedy = greedy_completion["choices"][0]
    assert greedy["prompt_token_ids"] == prompt_ids
    assert greedy_completion["usage"]["prompt_tokens"] == len(prompt_ids)
    whole = stack.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0}).json()
    choice = whole["choices"][0]
    assert choice["text"] == stack.tok.decode(greedy["token_ids"][:5], skip_special_tokens=True)
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert whole["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 5,
        "total_tokens": len(prompt_ids) + 5,
        "prompt_tokens_details": None,
    }


def assert_spec_details(details: dict, completion_tokens: int) -> None:
    """SGLang's verify counts of one choice, as serving.spec_details defines them over the engine's."""
    assert list(details) == [
        "spec_verify_ct",
        "spec_accept_length",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_accept_rate",
    ]
    ct, correct = details["spec_verify_ct"], details["spec_num_correct_drafts"]
    proposed = details["spec_num_proposed_drafts"]
    assert ct >= 1 and proposed == K * ct and 0 <= correct <= proposed
    # the prefill emits one token, each verification its accepted drafts and one more (the last may be cut)
    assert ct + correct <= completion_tokens <= 1 + ct + correct
    assert details["spec_accept_length"] == pytest.approx(completion_tokens / ct)
    assert details["spec_accept_rate"] == pytest.approx(correct / proposed)


def test_completion_keys(stack):
    body = {
        "prompt": [PROMPT, "Once upon a time"],
        "max_tokens": 3,
        "temperature": 0,
        "return_spec_tokens_details": True,
    }
    whole = stack.post("/v1/completions", body).json()
    assert list(whole) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
        "service_tier",
        "kv_transfer_params",
        "sglext",
    ]
    assert list(whole["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "prompt_logprobs",
        "token_ids",
        "prompt_token_ids",
    ]
    assert [c["finish_reason"] for c in whole["choices"]] == ["length"] * 2
    assert whole["usage"]["completion_tokens"] == 6
    details = whole["sglext"]["spec_tokens_details"]
    assert len(details) == 2
    for d in details:
        assert_spec_details(d, 3)
    assert "sglext" not in stack.post("/v1/completions", {**body, "return_spec_tokens_details": None}).json()
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chunks = events(stack.post("/v1/completions", stream))
    assert list(chunks[0]) == ["id", "object", "created", "model", "choices", "usage"]
    assert list(chunks[0]["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_token_ids",
    ]
    assert list(chunks[-2]) == ["id", "object", "created", "model", "choices", "usage"]  # the usage
    assert list(chunks[-1]) == ["id", "object", "created", "model", "choices", "usage", "sglext"]
    assert chunks[-2]["usage"]["completion_tokens"] == 6 and chunks[-1]["usage"] is None
    for d in chunks[-1]["sglext"]["spec_tokens_details"]:
        assert_spec_details(d, 3)


def harmony_split(tok, ids: list[int]) -> tuple[str, str]:
    """A harmony output `<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final
    <|message|>C<|return|>` -> (R, C) decoded."""
    message, end = tok.convert_tokens_to_ids("<|message|>"), tok.convert_tokens_to_ids("<|end|>")
    opened = [i for i, t in enumerate(ids) if t == message]
    assert len(opened) == 2 and tok.decode(ids[1 : opened[0]]) == "analysis", tok.decode(ids)
    return (
        tok.decode(ids[opened[0] + 1 : ids.index(end)], skip_special_tokens=True),
        tok.decode(ids[opened[1] + 1 :], skip_special_tokens=True),
    )


def test_chat_keys(stack, greedy_chat):
    assert list(greedy_chat) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "system_fingerprint",
        "service_tier",
        "kv_transfer_params",
    ]
    prompt_ids = render_prompt(stack.tok, MESSAGES)
    engine = stack.served.runner.engines["plain"]
    ref, _, _ = greedy_generate(engine.model, prompt_ids, CHAT_MAX, engine.eos_ids)
    reasoning, content = harmony_split(stack.tok, ref)
    assert greedy_chat["prompt_token_ids"] == prompt_ids
    assert greedy_chat["choices"][0] == {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": [],
        },
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": ref,
    }
    body = {
        "messages": MESSAGES,
        "max_tokens": 3,
        "temperature": 0,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_spec_tokens_details": True,
    }
    chunks = events(stack.post("/v1/chat/completions", body))
    first, body_chunks, last = chunks[0], chunks[1:-2], chunks[-1]
    assert list(first) == ["id", "object", "created", "model", "choices", "prompt_token_ids"]
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert [list(c["choices"][0]) for c in body_chunks[:-1]] == [
        ["index", "delta", "logprobs", "finish_reason", "token_ids"]
    ] * (len(body_chunks) - 1)
    assert list(body_chunks[-1]["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert sum((c["choices"][0]["token_ids"] for c in body_chunks), []) == ref[:3]
    assert list(chunks[-2]) == ["id", "object", "created", "model", "choices", "usage"]
    assert chunks[-2]["usage"]["completion_tokens"] == 3
    assert list(last) == ["id", "object", "created", "model", "choices", "sglext"]
    assert_spec_details(last["sglext"]["spec_tokens_details"], 3)


def test_errors_and_models(stack):
    r = stack.post("/v1/completions", {"prompt": PROMPT, "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    limit = stack.served.max_model_len
    r = stack.post("/v1/completions", {"prompt": PROMPT, "max_tokens": limit})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    assert r.json()["error"]["message"].startswith(f"This model's maximum context length is {limit} tokens.")
    r = stack.post("/v1/chat/completions", {"messages": []})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    m = stack.request("GET", "/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == "eyas-demo" == stack.served.name
    assert m["data"][0]["root"] == stack.served.root and m["data"][0]["max_model_len"] == limit
    assert m["data"][0]["permission"][0]["object"] == "model_permission"


def test_overrides_before_and_after_the_options():
    a = parse_args(["demo", "eval.k=3", "--port", "9", "target.device=cpu", "--k", "2", "x.y=1"])
    assert a.source == "demo" and a.overrides == ["eval.k=3", "target.device=cpu", "x.y=1"]
    assert a.port == 9 and a.k == 2
    for bad in (
        ["demo", "--port", "9", "stray"],
        ["demo", "--no-such-option"],
        ["demo", "--k", "2", "--tree", "1,1,1"],
    ):
        with pytest.raises(SystemExit):
            parse_args(bad)
