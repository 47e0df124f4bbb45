"""`eyas serve` started on 127.0.0.1 with the demo target and a draft, driven by real HTTP clients
(the `openai` package and httpx): concurrent greedy completions and chats equal the target's plain
greedy outputs token for token, streaming carries the same tokens and text, malformed requests get
vLLM's 4xx JSON error while the server keeps serving, /metrics carries vLLM's spec-decode counters,
and `eyas eval --server` reads the same acceptance from them as the built-in loop measures."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from serve_process import eyas_serve, free_port
from tiny_targets import draft_for

from eyas.data.chat import eos_token_ids, render_prompt
from eyas.data.target import load_target
from eyas.serve.decoding.reference import greedy_generate
from eyas.train.checkpoint import save_draft

MAX = 32
K = 3


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    model, tok = load_target("eyas-demo", "float32", "cpu")
    root = tmp_path_factory.mktemp("serve")
    draft = draft_for(model, 0, aux_ids=[1, 2, 3])
    save_draft(draft, root / "draft")
    return model, tok, set(eos_token_ids(model, tok)), root


@pytest.fixture(scope="module")
def server(demo):
    _, _, _, root = demo
    port = free_port()
    with eyas_serve(
        [
            "demo",
            "--draft",
            str(root / "draft"),
            "--k",
            str(K),
            "--max-num-seqs",
            "8",
            "target.dtype=float32",
            "target.device=cpu",
        ],
        port,
        root / "server.log",
    ):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key="not-needed", max_retries=0)


def extra(obj, key):
    return obj.model_dump()[key]


MESSAGES = [
    [{"role": "user", "content": q}]
    for q in (
        "What is 7 plus 5?",
        "Name three colors.",
        "Why is the sky blue?",
        "Spell the word cat backwards.",
    )
]


def test_concurrent_completions_equal_plain_greedy(demo, client):
    model, tok, eos, _ = demo
    name = client.models.list().data[0].id
    texts = ["The capital of France is", "Once upon a time", "def add(a, b):"]
    ids = [render_prompt(tok, m) for m in MESSAGES]
    prompts = texts + ids  # text prompts and token-id prompts
    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(
            pool.map(
                lambda p: client.completions.create(
                    model=name, prompt=p, max_tokens=MAX, temperature=0, extra_body={"return_token_ids": True}
                ),
                prompts,
            )
        )
    for p, out in zip(prompts, outs):
        choice = out.choices[0]
        p_ids = tok.encode(p) if isinstance(p, str) else p
        ref, _, _ = greedy_generate(model, p_ids, MAX, eos)
        assert extra(choice, "token_ids") == ref
        assert extra(choice, "prompt_token_ids") == p_ids
        assert choice.text == tok.decode(ref, skip_special_tokens=True)
        assert choice.finish_reason == ("stop" if ref[-1] in eos else "length")
        assert out.usage.completion_tokens == len(ref) and out.usage.prompt_tokens == len(p_ids)
        assert out.id.startswith("cmpl-") and out.object == "text_completion"


def test_concurrent_chats_through_the_chat_template(demo, client):
    model, tok, eos, _ = demo
    name = client.models.list().data[0].id
    with ThreadPoolExecutor(len(MESSAGES)) as pool:
        outs = list(
            pool.map(
                lambda m: client.chat.completions.create(
                    model=name,
                    messages=m,
                    max_tokens=96,
                    temperature=0,
                    extra_body={"return_token_ids": True},
                ),
                MESSAGES,
            )
        )
    special = {
        tok.convert_tokens_to_ids(t): t for t in ("<|channel|>", "<|message|>", "<|end|>", "<|return|>")
    }
    for m, out in zip(MESSAGES, outs):
        p_ids = render_prompt(tok, m)
        ref, _, _ = greedy_generate(model, p_ids, 96, eos)
        ids = extra(out.choices[0], "token_ids")
        assert ids == ref and extra(out, "prompt_token_ids") == p_ids
        # harmony: the analysis channel is reasoning_content, the final channel is content
        msg = out.choices[0].message
        i_final = max(i for i, t in enumerate(ids) if special.get(t) == "<|message|>")
        body = [t for t in ids[i_final + 1 :] if t not in special]
        assert msg.content == tok.decode(body, skip_special_tokens=True)
        assert extra(msg, "reasoning_content")  # the demo target reasons before answering
        assert out.object == "chat.completion" and msg.role == "assistant"


def test_streaming_carries_the_same_tokens(demo, client):
    name = client.models.list().data[0].id
    prompt = "Tell me a story about a cat"
    full = client.completions.create(
        model=name, prompt=prompt, max_tokens=MAX, temperature=0, extra_body={"return_token_ids": True}
    )
    chunks = list(
        client.completions.create(
            model=name,
            prompt=prompt,
            max_tokens=MAX,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
    )
    body = [c for c in chunks if c.choices]
    assert len(body) > 1
    assert sum((extra(c.choices[0], "token_ids") for c in body), []) == extra(full.choices[0], "token_ids")
    assert "".join(c.choices[0].text for c in body) == full.choices[0].text
    assert body[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in body[:-1])
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    # chat streaming: the content deltas add up to the non-streamed content
    msgs = MESSAGES[0]
    whole = client.chat.completions.create(model=name, messages=msgs, max_tokens=96, temperature=0)
    parts = list(
        client.chat.completions.create(model=name, messages=msgs, max_tokens=96, temperature=0, stream=True)
    )
    assert parts[0].choices[0].delta.role == "assistant"
    assert (
        "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
        == whole.choices[0].message.content
    )


def test_sampling_is_seeded_and_speculation_can_be_off(demo, client):
    model, tok, eos, _ = demo
    name = client.models.list().data[0].id
    kw = dict(
        model=name,
        prompt="Once upon a time",
        max_tokens=24,
        temperature=1.0,
        seed=1234,
        extra_body={"return_token_ids": True},
    )
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert extra(a.choices[0], "token_ids") == extra(b.choices[0], "token_ids")
    plain = client.completions.create(
        model=name,
        prompt="Once upon a time",
        max_tokens=MAX,
        temperature=0,
        extra_body={"return_token_ids": True, "speculative": False},
    )
    ref, _, _ = greedy_generate(model, tok.encode("Once upon a time"), MAX, eos)
    assert extra(plain.choices[0], "token_ids") == ref


def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server, client):
    bad = [
        ({"prompt": 5, "max_tokens": 4}, 400),  # not a prompt
        ({"prompt": "hi", "temperature": -1}, 400),
        ({"prompt": "hi", "max_tokens": 0}, 400),
        ({"prompt": [999999], "max_tokens": 4}, 400),  # token id outside the vocabulary
        ({"prompt": "hi", "max_tokens": 10**7}, 400),  # beyond the context length
        ({"prompt": "hi", "n": 2}, 400),
        ({"prompt": "hi", "model": "no-such-model"}, 404),
    ]
    for body, code in bad:
        r = httpx.post(f"{server}/v1/completions", json=body, timeout=30)
        assert r.status_code == code, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == code and err["message"] and err["type"]
    r = httpx.post(
        f"{server}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400
    ok = client.completions.create(
        model=client.models.list().data[0].id, prompt="hello", max_tokens=4, temperature=0
    )
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_models_health_and_metrics(server):
    assert httpx.get(f"{server}/health").status_code == 200
    models = httpx.get(f"{server}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"
    assert models["data"][0]["max_model_len"] > 0
    text = httpx.get(f"{server}/metrics").text
    for name in (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:num_requests_running",
    ):
        assert name in text, name
    drafts = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_drafts_total")
    )
    tokens = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_draft_tokens_total")
    )
    assert drafts > 0 and tokens == K * drafts


def test_eval_reads_acceptance_from_the_server(demo, server, tmp_path, capsys):
    """`eyas eval RUN --server URL`: the built-in loop and the server (the same draft, k and prompts)
    sit side by side; the server's Prometheus counters give the acceptance the loop measured, in all and
    per prompt-length bucket (two stdlib-long prompts of 1-2K tokens: the server gets one bucket at a time
    and reads its counters between them)."""
    from eyas.cli import main
    from eyas.data.long_text import records
    from eyas.recipes.load import dump_recipe, load_recipe

    _, _, _, root = demo
    run = tmp_path / "run"
    (run / "prompts").mkdir(parents=True)
    long = [[{"role": "user", "content": r["prompt"]}] for r in records("stdlib-long-1k", "test")[:2]]
    (run / "prompts" / "eval.jsonl").write_text(
        "".join(json.dumps({"id": str(i), "messages": m}) + "\n" for i, m in enumerate(MESSAGES + long))
    )
    import shutil

    shutil.copytree(root / "draft", run / "train" / "checkpoint-final")
    recipe = load_recipe("demo", ["target.dtype=float32", "target.device=cpu", "eval.max_new_tokens=48"])
    (run / "recipe.yaml").write_text(dump_recipe(recipe))
    rc = main(
        [
            "eval",
            str(run),
            "--server",
            f"eyas-serve={server}/v1",
            "--k",
            str(K),
            "--concurrency",
            "2",
            "--temperature",
            "0",
            "--no-progress",
        ]
    )
    assert rc == 0
    report = json.loads((run / "report.json").read_text())
    ours = next(r for r in report["results"] if r["engine"] == "eyas")
    theirs = next(r for r in report["results"] if r["engine"] == "eyas-serve")
    assert theirs["lossless"] is True and ours["lossless"] is True
    assert theirs["per_position_acceptance"] == pytest.approx(ours["per_position_acceptance"], abs=1e-12)
    # vLLM's formula: 1 + accepted / drafts
    assert theirs["acceptance_length"] == pytest.approx(1 + sum(ours["per_position_acceptance"]), abs=1e-12)
    assert theirs["target_forwards"] == ours["target_forwards"]
    assert list(theirs["by_length"]) == list(ours["by_length"]) == ["<1K", "1-2K"]
    for b, v in ours["by_length"].items():
        assert theirs["by_length"][b]["target_forwards"] == v["target_forwards"]
        assert theirs["by_length"][b]["num_prompts"] == v["num_prompts"] == {"<1K": 4, "1-2K": 2}[b]
        assert theirs["by_length"][b]["per_position_acceptance"] == pytest.approx(
            v["per_position_acceptance"], abs=1e-12
        )
    assert theirs["output_tokens_per_s"] > 0 and theirs["ttft_ms_p50"] > 0 and theirs["k"] == K
    assert "eyas-serve" in (run / "report.md").read_text()


def test_sglang_verify_counts_give_the_loops_tau(demo, server, monkeypatch):
    """Without Prometheus counters (SGLang), acceptance comes from each response's
    `sglext.spec_tokens_details.spec_verify_ct`: tau = (completion tokens - 1) / verifications,
    the loop's own emitted-tokens-per-verification."""
    from eyas.eval import server_client
    from eyas.eval.load import acceptance, run_engine
    from eyas.recipes.types import TreeShape
    from eyas.serve.decoding.engine import Engine
    from eyas.serve.decoding.sampling import SamplingParams
    from eyas.train.checkpoint import load_draft

    model, tok, eos, root = demo
    prompts = [render_prompt(tok, m) for m in MESSAGES]
    params = [SamplingParams(temperature=0, max_tokens=40) for _ in prompts]
    monkeypatch.setattr(server_client, "scrape", lambda client, url: {})
    res, engine, _, acc, _ = server_client.run_server(f"{server}/v1", prompts, params, concurrency=2)
    assert engine == "eyas-serve" and acc["per_position_acceptance"] == []
    draft = load_draft(root / "draft", device="cpu", dtype=torch.float32).eval()
    ours = run_engine(Engine(model, draft, TreeShape.chain(K), max_batch=2, eos_ids=eos), prompts, params, 2)
    assert res.outputs == ours.outputs
    assert acc["acceptance_length"] is None  # SGLang's count: tokens per forward only
    assert acc["tokens_per_forward"] == pytest.approx(
        acceptance(ours.emitted, ours.accepted, K)["tokens_per_forward"], abs=1e-12
    )
