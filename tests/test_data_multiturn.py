"""Multi-turn regeneration on the demo gpt-oss target (harmony): every user turn answered in order, each
turn's prompt the chat template's rendering of the conversation with the target's own earlier answers
(their analysis channel dropped, as gpt-oss's template does), each answer the greedy continuation of
exactly that prompt; a conversation ends at an unfinished answer or an over-long prompt."""

from pathlib import Path

import pytest
import torch
from data_fixtures import TURNS, prompt_lengths_by_characters, write_conversations

from eyas.data.chat import answer_message, eos_token_ids, pad_token_id, render_prompt, split_turns
from eyas.data.prompts import read_prompts, run_prompts
from eyas.data.regenerate import generate_batch, read_sequences, run_regenerate
from eyas.data.target import load_target
from eyas.infra import layout
from eyas.infra.io import read_jsonl
from eyas.recipes.load import load_recipe

BASE = ["target.dtype=float32", "target.device=cpu", "data.num_eval_prompts=2", "data.batch_size=3"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiturn")
    model, tok = load_target("eyas-demo", "float32", "cpu")
    return root, write_conversations(root / "conversations.jsonl"), model, tok


def regenerate(demo, name: str, *overrides):
    root, prompts, _, _ = demo
    r = load_recipe("demo", BASE + [f"data.prompts={prompts}", *overrides])
    run_prompts(r, root / name, progress=False)
    return run_regenerate(r, root / name, progress=False, part_batches=1), root / name


def test_every_turn_answered_with_the_targets_own_earlier_answers(demo):
    _, _, model, tok = demo
    stats, run = regenerate(demo, "full", "data.max_new_tokens=64")
    seqs = read_sequences(run)
    assert stats["num_conversations"] == 6 and stats["num_sequences"] == 6 * TURNS == len(seqs)
    assert stats["num_turns_not_answered"] == 0 and stats["fraction_finished"] == 1.0
    eos, pad = eos_token_ids(model, tok), None
    pad = pad_token_id(model, tok, eos)
    prompts = {p["id"]: p["messages"] for p in read_jsonl(run / "prompts" / "train.jsonl")}
    by_conv: dict[str, list[dict]] = {}
    for s in seqs:
        by_conv.setdefault(s["conversation"], []).append(s)
    dropped_analysis = 0
    for cid, turns in by_conv.items():
        assert [s["turn"] for s in turns] == list(range(TURNS))
        assert [s["id"] for s in turns] == [cid, f"{cid}/1", f"{cid}/2"]
        system, users = split_turns(prompts[cid])
        assert system in ([], [{"role": "system", "content": "Answer briefly."}]) and len(users) == TURNS
        context = system + users[:1]
        for t, s in enumerate(turns):
            prompt, gen = s["input_ids"][: s["prompt_len"]], s["input_ids"][s["prompt_len"] :]
            assert prompt == render_prompt(
                tok, context
            )  # exactly the template's rendering of the conversation
            ((alone, finished),) = generate_batch(
                model, [prompt], eos_ids=eos, pad_id=pad, max_new_tokens=64, temperature=0.0, top_p=1.0
            )
            assert gen == alone and finished == s["finished"]  # the greedy answer to exactly that prompt
            answer = answer_message(tok, gen, eos)
            text = tok.decode(gen, skip_special_tokens=False)
            assert f"<|channel|>final<|message|>{answer['content']}<|return|>" in text
            if t + 1 < TURNS:
                later = tok.decode(
                    turns[t + 1]["input_ids"][: turns[t + 1]["prompt_len"]], skip_special_tokens=False
                )
                assert f"<|channel|>final<|message|>{answer['content']}<|end|>" in later
                if answer.get("thinking"):  # gpt-oss's template drops an earlier turn's analysis
                    assert answer["thinking"] not in later
                    dropped_analysis += 1
            context = context + [answer] + users[t + 1 : t + 2]
    assert dropped_analysis > 0


def test_an_unfinished_answer_ends_its_conversation(demo):
    stats, run = regenerate(demo, "short", "data.max_new_tokens=3")
    seqs = read_sequences(run)
    assert [s["turn"] for s in seqs] == [0] * 6 and not any(s["finished"] for s in seqs)
    assert stats["num_sequences"] == 6 and stats["num_turns_not_answered"] == 6 * (TURNS - 1)


def test_a_later_prompt_over_max_prompt_tokens_ends_its_conversation(demo):
    _, _, _, tok = demo
    root, prompts, _, _ = demo
    r = load_recipe("demo", BASE + [f"data.prompts={prompts}"])
    run_prompts(r, root / "lengths", progress=False)
    first = [
        len(render_prompt(tok, split_turns(p["messages"])[0] + split_turns(p["messages"])[1][:1]))
        for p in read_jsonl(root / "lengths" / "prompts" / "train.jsonl")
    ]
    limit = max(first) + 4  # every first turn fits, no second turn does (it holds a whole answer more)
    stats, run = regenerate(demo, "lengths", "data.max_new_tokens=64", f"data.max_prompt_tokens={limit}")
    seqs = read_sequences(run)
    assert stats["num_skipped_long"] == 0 and [s["turn"] for s in seqs] == [0] * 6
    assert stats["num_turns_not_answered"] == 6 * (TURNS - 1)


def test_answer_message_reads_harmony_channels_and_plain_text(demo):
    _, _, model, tok = demo
    eos = eos_token_ids(model, tok)
    ids = tok.encode(
        "<|channel|>analysis<|message|>Think a bit.<|end|><|start|>assistant<|channel|>final"
        "<|message|>It is 4.<|return|>",
        add_special_tokens=False,
    )
    assert answer_message(tok, ids, eos) == {
        "role": "assistant",
        "content": "It is 4.",
        "thinking": "Think a bit.",
    }
    final_only = tok.encode("<|channel|>final<|message|>Yes.<|return|>", add_special_tokens=False)
    assert answer_message(tok, final_only, eos) == {"role": "assistant", "content": "Yes."}
    assert torch.equal(torch.tensor(ids), torch.tensor(tok.encode(tok.decode(ids), add_special_tokens=False)))


def regenerated(run, model, tok) -> tuple[dict, dict]:
    """A regenerated run's conversations and answers. -> ({conversation id: (system messages, user turns)},
    {conversation id: [(its sequence row, the tokens the template keeps of its answer: the final
    channel)]})."""
    eos = eos_token_ids(model, tok)
    convs = {r["id"]: split_turns(r["messages"]) for r in read_jsonl(run / "prompts" / "train.jsonl")}
    answers: dict[str, list[tuple[dict, int]]] = {}
    for s in read_sequences(run):
        final = answer_message(tok, s["input_ids"][s["prompt_len"] :], eos)["content"]
        answers.setdefault(s["conversation"], []).append(
            (s, len(tok.encode(final, add_special_tokens=False)))
        )
    return convs, answers


def test_plan_counts_turns_and_renders_prompts_as_regeneration_does(demo, tmp_path, monkeypatch):
    """`eyas plan --run RUN` on a run whose prompts stage alone is done (no GPU needed yet). Each turn's
    prompt length is the template's rendering of the conversation with the earlier answers empty, plus
    the tokens the template keeps of each (harmony: the final channel): given the real answers' kept
    parts, exactly the prompt lengths regeneration then renders. The plan counts every conversation's
    turns (at most data.max_turns), renders a seeded sample with each earlier answer as an assumed share
    of the assumed answer length, leaves out turns over data.max_prompt_tokens as regeneration does, and
    without data.num_prompts plans the prompts stage's conversations."""
    import itertools
    import shutil

    import eyas.plan.tokens
    from eyas.plan.command import plan
    from eyas.plan.cost import Assumptions
    from eyas.plan.report import render
    from eyas.plan.tokens import turn_prompt_lengths

    stats, run = regenerate(demo, "plan", "data.max_new_tokens=64")
    _, prompts, model, tok = demo
    convs, answers = regenerated(run, model, tok)
    assert len(answers) == len(convs) == 6 and stats["num_sequences"] == 6 * TURNS
    for (
        cid,
        turns,
    ) in answers.items():  # the lengths regeneration rendered, from the real answers' final channels
        kept = [n for _, n in turns]
        assert turn_prompt_lengths(tok, *convs[cid], kept, 10**9) == [s["prompt_len"] for s, _ in turns]

    only = tmp_path / "prompts-only"
    shutil.copytree(run / "prompts", only / "prompts")
    a = Assumptions()
    new = a.new_token_fraction * 64
    kept = a.kept_answer_fraction_harmony * new  # the demo target's template is harmony: analysis dropped
    lengths = {
        cid: turn_prompt_lengths(tok, system, users, [kept] * TURNS, 10**9)
        for cid, (system, users) in convs.items()
    }
    over = BASE + [f"data.prompts={prompts}", "data.max_new_tokens=64", "data.num_prompts=600"]
    p = plan(load_recipe("demo", over), "1xH100", run_dir=only)
    mean_prompt = sum(map(sum, lengths.values())) / (6 * TURNS)
    assert p.sequences == 600 * TURNS and p.conversations == 600  # every turn fits: all answered
    assert p.mean_tokens == pytest.approx(mean_prompt + new) and p.tokens == pytest.approx(
        1800 * (mean_prompt + new)
    )
    assert p.stages_measured == ["prompts"] and p.measured == [] and p.turns.rendered == 6
    text = render(load_recipe("demo", over), p)
    assert (
        f"data: 600 conversations x 3.00 answered turns = 1,800 sequences x {mean_prompt + new:,.0f} tokens"
        in text
    )
    assert "18 user turns counted in 6 conversations, prompts rendered for 6 of 6 conversations" in text
    assert f"hold each earlier answer as {kept:,.0f} tokens" in text and "(an upper bound)" in text

    # a prompt limit that only some later turns fit under: those over it are not counted, nor any after them
    limit = int(mean_prompt)
    fit = {cid: [n for n in ls if n <= limit] for cid, ls in lengths.items()}
    assert all(ls == lengths[cid][: len(ls)] for cid, ls in fit.items())  # the fitting turns come first
    cut = sum(map(len, fit.values()))
    assert 6 <= cut < 6 * TURNS
    short = plan(load_recipe("demo", over + [f"data.max_prompt_tokens={limit}"]), "1xH100", run_dir=only)
    assert short.sequences == round(600 * cut / 6)
    assert short.mean_tokens == pytest.approx(sum(map(sum, fit.values())) / cut + new)
    with pytest.raises(
        ValueError,
        match=r"data.max_prompt_tokens=8: no first prompt of the 6 conversations rendered "
        "fits under it, so regeneration would answer none",
    ):
        plan(load_recipe("demo", over + ["data.max_prompt_tokens=8"]), "1xH100", run_dir=only)
    # fewer turns asked by the recipe than the prompts stage kept; no data.num_prompts: the stage's
    # conversations
    two = plan(
        load_recipe("demo", over + ["data.max_turns=2", "data.num_prompts=null"]), "1xH100", run_dir=only
    )
    assert two.conversations == 6 and two.sequences == 6 * 2
    assert two.mean_tokens == pytest.approx(sum(ls[0] + ls[1] for ls in lengths.values()) / 12 + new)
    # more conversations than are rendered: a seeded sample of them gives the mean prompt, all give the turns
    monkeypatch.setattr(eyas.plan.tokens, "SAMPLED_CONVERSATIONS", 3)
    sampled = plan(load_recipe("demo", over), "1xH100", run_dir=only)
    assert sampled.turns.rendered == 3 and sampled.sequences == 600 * TURNS
    means = {round(sum(map(sum, c)) / (3 * TURNS), 6) for c in itertools.combinations(lengths.values(), 3)}
    assert round(sampled.mean_tokens - new, 6) in means
    assert "prompts rendered for 3 of 6 conversations" in render(load_recipe("demo", over), sampled)


@pytest.mark.parametrize(
    "files", [(), ("tokenizer.json", "tokenizer_config.json")], ids=["none", "no-template"]
)
def test_plan_counts_turns_without_the_targets_tokenizer(demo, tmp_path, files):
    """A target whose tokenizer cannot be had, or has no chat template (a directory with its config and
    weights, and no tokenizer or no template, offline): the turns are still counted from the prompts
    stage, the prompt lengths estimated from their characters, and the plan says why and which files to
    put there."""
    import shutil

    from eyas.data.target import resolve_path
    from eyas.plan.command import plan
    from eyas.plan.cost import Assumptions
    from eyas.plan.report import render

    _, prompts, _, _ = demo
    run = tmp_path / "run"
    run_prompts(
        load_recipe("demo", BASE + [f"data.prompts={prompts}"]), run, progress=False
    )  # that stage alone
    target = tmp_path / "no-tokenizer"
    target.mkdir()
    for f in ("config.json", "generation_config.json", "model.safetensors", *files):
        shutil.copy(Path(resolve_path("eyas-demo")) / f, target / f)
    over = BASE + [
        f"data.prompts={prompts}",
        f"target.model={target}",
        "data.max_new_tokens=64",
        "data.num_prompts=600",
    ]
    p = plan(load_recipe("demo", over), "1xH100", run_dir=run)
    a = Assumptions()
    kept = a.kept_answer_fraction_harmony * a.new_token_fraction * 64  # its config says gpt_oss: harmony
    assert p.sequences == 600 * TURNS and p.turns.rendered == 0
    lengths = prompt_lengths_by_characters(read_prompts(run, "train"), kept)
    assert p.mean_tokens == pytest.approx(sum(lengths) / len(lengths) + a.new_token_fraction * 64)
    text = render(load_recipe("demo", over), p)
    assert f"the tokenizer of {target} could not be used" in text
    assert ("(it has no chat template)" in text) == bool(files)
    assert (
        "put the model's tokenizer files (tokenizer.json, tokenizer_config.json, its chat template) in "
        f"{target}" in text
    )
    assert "prompts at 4 characters a token, + 8 a message" in text


# room for most answers to end with the longer system messages (64 left one turn unanswered with
# the demo target v2 built on one CPU; 128 still left one conversation at two turns on another: the demo
# target's weights depend on the CPU that trains it, so the test checks the turns regeneration answered)
EFFORT_MAX_NEW = 128


def test_plan_renders_each_prompt_with_its_reasoning_effort(demo, tmp_path):
    """A template that puts the reasoning effort into the system message (as gpt-oss's does), here as one,
    two or five words so the effort changes the length: the plan renders each conversation's turns with the
    effort regeneration draws for it, and gets exactly the prompt lengths regeneration then renders."""
    import shutil

    from eyas.data.chat import effort_kwargs, reasoning_effort
    from eyas.data.target import resolve_path
    from eyas.plan.command import plan
    from eyas.plan.cost import Assumptions
    from eyas.plan.tokens import turn_prompt_lengths

    target = shutil.copytree(resolve_path("eyas-demo"), tmp_path / "target")
    template = (target / "chat_template.jinja").read_text()
    words = "(' Think.' * {'low': 1, 'medium': 2, 'high': 5}[reasoning_effort | default('medium')])"
    template = template.replace(
        "text(messages[0].content) + '<|end|>'", f"text(messages[0].content) + {words} + '<|end|>'"
    )
    template = template.replace(
        "'<|start|>system<|message|>You are a helpful assistant.<|end|>'",
        f"'<|start|>system<|message|>You are a helpful assistant.' + {words} + '<|end|>'",
    )
    assert template.count("Think.") == 2
    (target / "chat_template.jinja").write_text(template)
    weights = {"low": 1, "medium": 1, "high": 1}
    stats, run = regenerate(
        demo,
        "effort",
        f"target.model={target}",
        f"data.max_new_tokens={EFFORT_MAX_NEW}",
        "data.reasoning_effort={low: 1, medium: 1, high: 1}",
    )
    _, _, model, tok = demo
    tok = type(tok).from_pretrained(target)
    convs, answers = regenerated(run, model, tok)
    efforts = {cid: reasoning_effort(weights, 0, cid) for cid in convs}
    # every conversation's first turn, and later turns (with earlier answers in their prompts) in most
    assert len(set(efforts.values())) > 1 and len(answers) == 6 and stats["num_sequences"] > 6 * (TURNS - 1)
    for cid, turns in answers.items():
        assert {s["reasoning_effort"] for s, _ in turns} == {efforts[cid]}
        kept, n = [n for _, n in turns], len(turns)
        with_effort = turn_prompt_lengths(tok, *convs[cid], kept, 10**9, **effort_kwargs(efforts[cid]))[:n]
        assert with_effort == [s["prompt_len"] for s, _ in turns]
        other = "high" if efforts[cid] != "high" else "low"
        assert turn_prompt_lengths(tok, *convs[cid], kept, 10**9, reasoning_effort=other)[:n] != with_effort
    # the plan from the prompts stage alone renders each conversation with its own effort
    only = tmp_path / "prompts-only"
    shutil.copytree(run / "prompts", only / "prompts")
    a = Assumptions()
    kept = [a.kept_answer_fraction_harmony * a.new_token_fraction * EFFORT_MAX_NEW] * TURNS
    mean = {
        e: sum(
            sum(turn_prompt_lengths(tok, *convs[cid], kept, 10**9, **effort_kwargs(e or efforts[cid])))
            for cid in convs
        )
        / (6 * TURNS)
        for e in (None, "medium")
    }
    assert mean[None] != mean["medium"]  # the template's default effort would give another mean
    _, prompts, _, _ = demo
    p = plan(
        load_recipe(
            "demo",
            BASE
            + [
                f"data.prompts={prompts}",
                f"target.model={target}",
                f"data.max_new_tokens={EFFORT_MAX_NEW}",
                "data.reasoning_effort={low: 1, medium: 1, high: 1}",
            ],
        ),
        "1xH100",
        run_dir=only,
    )
    assert p.turns.rendered == 6 and p.mean_tokens == pytest.approx(
        mean[None] + a.new_token_fraction * EFFORT_MAX_NEW
    )


def test_regeneration_counts_turns_per_conversation_where_prompts_have_a_group(demo, tmp_path):
    """Long prompts carry their document as a group (data/prompts.py): several excerpts of one document
    are several conversations, and the stage record counts each one's turns (it once looked them up by
    group: KeyError 'stdlib:<module>' at the end of regeneration), and a resumed run keeps the parts it
    wrote (checked by group, they were refused as holding other prompts)."""
    r = load_recipe(
        "demo",
        BASE
        + [
            "data.prompts=[{source: stdlib-long-2k, name: stdlib}]",
            "data.num_prompts=6",
            "data.num_eval_prompts=0",
            "data.max_new_tokens=4",
            "data.max_prompt_tokens=4096",
        ],
    )
    run_prompts(r, tmp_path, progress=False)
    prompts = read_prompts(tmp_path, "train")
    assert all(p["group"].startswith("stdlib:") for p in prompts)
    stats = run_regenerate(r, tmp_path, progress=False)
    assert stats["num_conversations"] == len(prompts) - stats["num_skipped_long"]
    assert stats["num_turns_not_answered"] == 0 and stats["num_sequences"] == stats["num_conversations"]
    layout.marker(tmp_path, "regenerate").unlink()  # a run killed before its record: it resumes, the parts
    again = run_regenerate(r, tmp_path, progress=False)  # kept (they were once checked against groups)
    assert again["num_sequences"] == stats["num_sequences"] and again["generated_tokens_this_run"] == 0
