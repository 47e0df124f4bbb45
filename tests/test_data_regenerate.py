"""The regen stage on a tiny random gpt-oss target: exact token ids, loss mask, batching, resume."""

import pytest
import torch
from data_fixtures import make_tiny_target, one_thread, write_prompts  # noqa: F401  (one_thread: fixture)

import eyas.data.regenerate as regen
from eyas.data.chat import cut_at_eos, render_prompt
from eyas.data.prompts import read_prompts, run_prompts
from eyas.data.regenerate import loss_mask, read_sequences, run_regenerate
from eyas.data.target import load_target
from eyas.recipes.load import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("regen")
    return make_tiny_target(root / "target", num_layers=4), write_prompts(root / "prompts.jsonl", 12)


def recipe(setup, **data):
    target, prompts = setup
    return load_recipe(
        {
            "target": {"model": str(target), "dtype": "float32", "device": "cpu"},
            "data": {
                "prompts": str(prompts),
                "num_eval_prompts": 2,
                "batch_size": 4,
                "max_new_tokens": 10,
                **data,
            },
        }
    )


def run(setup, run_dir, part_batches=1, **data):
    r = recipe(setup, **data)
    run_prompts(r, run_dir, progress=False)
    return run_regenerate(r, run_dir, progress=False, part_batches=part_batches)


def test_cut_at_eos():
    assert cut_at_eos([3, 4, 5, 4, 9], {4, 5}) == ([3, 4], True)
    assert cut_at_eos([3, 6], {4}) == ([3, 6], False)
    assert loss_mask({"input_ids": [1, 2, 3, 4, 5], "prompt_len": 3}) == [0, 0, 0, 1, 1]


def test_ids_mask_and_batched_equals_unbatched_greedy(setup, tmp_path):
    stats = run(setup, tmp_path)
    seqs = read_sequences(tmp_path)
    prompts = {p["id"]: p["messages"] for p in read_prompts(tmp_path, "train")}
    assert stats["num_sequences"] == len(seqs) == len(prompts) == 10 and stats["num_skipped_long"] == 0
    assert stats["num_parts"] == 3 and len(list((tmp_path / "regenerate").glob("part-*.jsonl"))) == 3
    model, tok = load_target(str(setup[0]), "float32", "cpu")
    eos = set(model.generation_config.eos_token_id)
    finished = []
    for s in seqs:
        prompt = render_prompt(tok, prompts[s["id"]])
        assert s["input_ids"][: s["prompt_len"]] == prompt and s["prompt_len"] == len(prompt)
        assert loss_mask(s) == [0] * len(prompt) + [1] * (len(s["input_ids"]) - len(prompt))
        gen = s["input_ids"][len(prompt) :]
        # the same prompt alone, greedy, through plain `generate`: batched left-padded == unbatched
        with torch.no_grad():
            alone = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False)[
                0, len(prompt) :
            ]
        assert gen == alone.tolist()
        assert s["finished"] == (gen[-1] in eos) and not eos & set(gen[:-1])
        finished.append(s["finished"])
    assert any(finished) and not all(finished)  # both cases are exercised
    assert stats["fraction_finished"] == sum(finished) / 10
    assert stats["mean_generated_tokens"] == sum(len(s["input_ids"]) - s["prompt_len"] for s in seqs) / 10


def test_long_prompts_skipped(setup, tmp_path):
    _, tok = load_target(str(setup[0]), "float32", "cpu")
    run_prompts(recipe(setup), tmp_path, progress=False)
    lengths = sorted(len(render_prompt(tok, p["messages"])) for p in read_prompts(tmp_path, "train"))
    limit = lengths[4]
    stats = run_regenerate(recipe(setup, max_prompt_tokens=limit), tmp_path, progress=False)
    assert stats["num_skipped_long"] == sum(n > limit for n in lengths) > 0
    assert all(s["prompt_len"] <= limit for s in read_sequences(tmp_path))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_resume_after_crash_equals_uninterrupted(setup, tmp_path, monkeypatch, temperature):
    run(setup, tmp_path / "full", temperature=temperature)
    calls = []
    real = regen.generate_batch

    def crash_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("simulated crash")
        return real(*args, **kwargs)

    monkeypatch.setattr(regen, "generate_batch", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        run(setup, tmp_path / "resumed", temperature=temperature)
    parts = sorted(p.name for p in (tmp_path / "resumed" / "regenerate").iterdir())
    assert parts == ["part-00000.jsonl", "part-00001.jsonl"]  # only complete parts, no DONE.json, no tmp
    calls.clear()
    stats = run(setup, tmp_path / "resumed", temperature=temperature)
    assert len(calls) == 1  # only the missing batch was generated
    assert read_sequences(tmp_path / "resumed") == read_sequences(tmp_path / "full")
    assert stats["num_sequences"] == 10
    assert not list((tmp_path / "resumed" / "regenerate").glob(".*.tmp"))


def test_resume_refuses_changed_batching(setup, tmp_path):
    (tmp_path / "regenerate").mkdir()
    r = recipe(setup)
    run_prompts(r, tmp_path, progress=False)
    first = [p["id"] for p in read_prompts(tmp_path, "train")][:1]
    (tmp_path / "regenerate" / "part-00000.jsonl").write_text(
        "".join(f'{{"id": "{i}", "input_ids": [1], "prompt_len": 1, "finished": false}}\n' for i in first)
    )
    with pytest.raises(RuntimeError, match="part-00000.jsonl: holds other prompts than this run"):
        run_regenerate(r, tmp_path, progress=False)


# the effort as a word of the tiny vocabulary (low -> one, medium -> two, high -> three), so it changes the
# ids
HARMONY_WITH_EFFORT = (
    "<|start|>system<|message|>"
    "{{ {'low': 'one', 'medium': 'two', 'high': 'three'}[reasoning_effort | default('medium')] }}<|end|>"
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|channel|>analysis<|message|>{% endif %}"
)


def test_reasoning_effort_reaches_each_prompt_and_is_recorded(setup, tmp_path):
    """gpt-oss's template puts the effort in the system message; each prompt gets one drawn from the
    weights (seeded by the prompt id), rendered into its ids and stored with it."""
    import shutil

    from transformers import AutoTokenizer

    target = tmp_path / "target"
    shutil.copytree(setup[0], target)
    tok = AutoTokenizer.from_pretrained(target)
    tok.chat_template = HARMONY_WITH_EFFORT
    tok.save_pretrained(target)
    weights = {"low": 4, "medium": 4, "high": 2}
    stats = run((target, setup[1]), tmp_path / "run", reasoning_effort=weights, temperature=0.0)
    seqs = read_sequences(tmp_path / "run")
    prompts = {p["id"]: p["messages"] for p in read_prompts(tmp_path / "run", "train")}
    for s in seqs:
        assert s["reasoning_effort"] == regen.reasoning_effort(weights, 0, s["id"])
        rendered = render_prompt(tok, prompts[s["id"]], reasoning_effort=s["reasoning_effort"])
        assert s["input_ids"][: s["prompt_len"]] == rendered
        other = "high" if s["reasoning_effort"] != "high" else "low"
        assert render_prompt(tok, prompts[s["id"]], reasoning_effort=other) != rendered
    assert stats["reasoning_effort_mix"] == {
        lvl: sum(s["reasoning_effort"] == lvl for s in seqs)
        for lvl in sorted({s["reasoning_effort"] for s in seqs})
    }
    assert stats["temperature"] == 0.0
    # the draw follows the weights: 20,000 prompt ids within 1.5 points of 40 / 40 / 20 %
    draws = [regen.reasoning_effort(weights, 0, str(i)) for i in range(20_000)]
    for lvl, share in (("low", 0.4), ("medium", 0.4), ("high", 0.2)):
        assert abs(draws.count(lvl) / len(draws) - share) < 0.015, lvl
    assert regen.reasoning_effort(None, 0, "7") is None


def test_reasoning_effort_with_a_template_that_ignores_it_names_the_key(setup, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"data.reasoning_effort: the chat template of .* does not use "
        r"reasoning_effort",
    ):
        run(setup, tmp_path, reasoning_effort={"high": 1})
