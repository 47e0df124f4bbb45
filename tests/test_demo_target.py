"""The built-in demo target: corpus, tokenizer and chat template, and a (tiny) cached build."""

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, GptOssForCausalLM

from eyas.data.chat import render_prompt
from eyas.data.demo_target.build import MARKER, NUM_PROMPTS, ensure_demo_target
from eyas.data.demo_target.corpus import FAMILIES, generate_conversations, write_prompts
from eyas.data.demo_target.quality import parse_answer
from eyas.data.demo_target.tokenizer import DEFAULT_SYSTEM, build_tokenizer, corpus_texts
from eyas.data.demo_target.training import encode


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(corpus_texts(generate_conversations(1000, 0)))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A complete demo target directory, trained for 2 steps only."""
    return ensure_demo_target(tmp_path_factory.mktemp("cache") / "demo", steps=2, progress=False)


def test_corpus_is_deterministic_and_in_messages_layout():
    a, b = generate_conversations(200, 7), generate_conversations(200, 7)
    assert a == b
    assert a != generate_conversations(200, 8)
    assert generate_conversations(50, 7) == a[:50]  # a shorter draw is a prefix
    for r in a:
        user, assistant = r["messages"]
        assert user["role"] == "user" and user["content"]
        assert assistant["role"] == "assistant" and assistant["thinking"] and assistant["content"]


def test_every_family_appears():
    questions = " ".join(r["messages"][0]["content"] for r in generate_conversations(300, 0))
    for word in ("plus", "minus", "capital", "colour", "odd", "order", "rever", "many"):
        assert word in questions, word
    assert len(FAMILIES) >= 8


def test_prompts_writer(tmp_path):
    write_prompts(tmp_path / "p.jsonl", 20, 3)
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert rows == [{"messages": r["messages"][:1]} for r in generate_conversations(20, 3)]


def test_tokenizer_round_trips_text(tokenizer):
    texts = corpus_texts(generate_conversations(300, 99))
    assert all(tokenizer.decode(tokenizer(t)["input_ids"]) == t for t in texts)
    other = "Ünïcode ✓, tabs\tand\nnewlines; 12345 <x>"  # byte-level: anything encodes and decodes
    assert tokenizer.decode(tokenizer(other)["input_ids"]) == other
    assert [tokenizer.decode([i]).strip() for i in tokenizer(" 907")["input_ids"]] == ["9", "0", "7"]
    assert 300 <= len(tokenizer) <= 1100


def test_tokenizer_training_is_deterministic(tokenizer):
    again = build_tokenizer(corpus_texts(generate_conversations(1000, 0)))
    assert again.get_vocab() == tokenizer.get_vocab()


def test_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|return|>" and tokenizer.pad_token == "<|pad|>"
    for t in ("<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>"):
        assert len(tokenizer(t)["input_ids"]) == 1, t


def test_chat_template_harmony_format(tokenizer):
    conv = [{"role": "user", "content": "Q?"}, {"role": "assistant", "thinking": "R.", "content": "A."}]
    text = tokenizer.apply_chat_template(conv, tokenize=False)
    assert text == (
        f"<|start|>system<|message|>{DEFAULT_SYSTEM}<|end|><|start|>user<|message|>Q?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>R.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>A.<|return|>"
    )
    prompt = tokenizer.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|end|><|start|>assistant") and text.startswith(prompt)
    assert parse_answer(text[len(prompt) :]) == ("R.", "A.")


def test_chat_template_generic_messages(tokenizer):
    """ShareGPT-style data: a system prompt, assistants without thinking, text-part content."""
    conv = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
        {"role": "assistant", "content": "ok"},
    ]
    assert tokenizer.apply_chat_template(conv, tokenize=False) == (
        "<|start|>system<|message|>Be brief.<|end|><|start|>user<|message|>hi<|end|>"
        "<|start|>assistant<|channel|>final<|message|>hello<|end|><|start|>user<|message|>again<|end|>"
        "<|start|>assistant<|channel|>final<|message|>ok<|return|>"
    )
    assert tokenizer.apply_chat_template(conv[:4], tokenize=False, add_generation_prompt=True).endswith(
        "<|message|>again<|end|><|start|>assistant"
    )


def test_prompt_is_a_prefix_of_the_conversation(tokenizer):
    records = generate_conversations(20, 1)
    for r, (ids, prompt_len) in zip(records, encode(tokenizer, records)):
        assert ids == render_prompt(tokenizer, r["messages"], False)
        assert tokenizer.convert_ids_to_tokens(ids[prompt_len - 2 : prompt_len]) == ["<|start|>", "assistant"]
        assert ids[-1] == tokenizer.eos_token_id


def test_save_and_reload_keep_ids(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for r in generate_conversations(20, 5):
        assert render_prompt(reloaded, r["messages"], False) == render_prompt(tokenizer, r["messages"], False)
        assert render_prompt(reloaded, r["messages"][:1]) == render_prompt(tokenizer, r["messages"][:1])
    assert (reloaded.eos_token_id, reloaded.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)


def test_built_target_loads_like_any_model(built):
    model = AutoModelForCausalLM.from_pretrained(built)
    tok = AutoTokenizer.from_pretrained(built)
    assert isinstance(model, GptOssForCausalLM)
    cfg = model.config
    assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    assert cfg.sliding_window == 32 and cfg.num_local_experts > cfg.num_experts_per_tok > 1
    assert cfg.vocab_size == len(tok)
    assert cfg.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|return|>")
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert (built / "model.safetensors").is_file()
    prompts = [json.loads(line) for line in (built / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == NUM_PROMPTS
    assert all([m["role"] for m in p["messages"]] == ["user"] for p in prompts)
    info = json.loads((built / MARKER).read_text())
    assert info["build"]["steps"] == 2
    assert {"well_formed", "correct", "mean_entropy"} <= set(info["quality"])


def test_complete_build_is_reused(built):
    stamp = (built / MARKER).stat().st_mtime_ns
    assert ensure_demo_target(built, steps=2, progress=False) == built
    assert (built / MARKER).stat().st_mtime_ns == stamp
    assert not list(built.parent.glob(".*"))  # no temporary build directories left behind


def test_unfinished_build_is_replaced(tmp_path):
    target = tmp_path / "demo"
    target.mkdir()
    (target / "config.json").write_text("{}")  # a crashed build: no marker
    assert ensure_demo_target(target, steps=1, progress=False) == target
    assert json.loads((target / MARKER).read_text())["build"]["steps"] == 1
    assert isinstance(AutoModelForCausalLM.from_pretrained(target), GptOssForCausalLM)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
