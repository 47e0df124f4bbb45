"""Multi-turn regeneration on the demo gpt-oss target (harmony): every user turn answered in order, each
turn's prompt the chat template's rendering of the conversation with the target's own earlier answers
(their analysis channel dropped, as gpt-oss's template does), each answer the greedy continuation of
exactly that prompt; a conversation ends at an unfinished answer or an over-long prompt."""

import pytest
import torch
from data_fixtures import TURNS, write_conversations

from eyas.data.prompts import run_prompts
from eyas.data.regenerate import (answer_message, eos_token_ids, generate_batch, pad_token_id, read_sequences,
                                  render_prompt, run_regenerate, split_turns)
from eyas.data.target import load_target
from eyas.io import read_jsonl
from eyas.recipes.schema import load_recipe

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
            prompt, gen = s["input_ids"][:s["prompt_len"]], s["input_ids"][s["prompt_len"]:]
            assert prompt == render_prompt(tok, context)  # exactly the template's rendering of the conversation
            (alone, finished), = generate_batch(model, [prompt], eos_ids=eos, pad_id=pad, max_new_tokens=64,
                                                temperature=0.0, top_p=1.0)
            assert gen == alone and finished == s["finished"]  # the greedy answer to exactly that prompt
            answer = answer_message(tok, gen, eos)
            text = tok.decode(gen, skip_special_tokens=False)
            assert f"<|channel|>final<|message|>{answer['content']}<|return|>" in text
            if t + 1 < TURNS:
                later = tok.decode(turns[t + 1]["input_ids"][:turns[t + 1]["prompt_len"]], skip_special_tokens=False)
                assert f"<|channel|>final<|message|>{answer['content']}<|end|>" in later
                if answer.get("thinking"):  # gpt-oss's template drops an earlier turn's analysis
                    assert answer["thinking"] not in later
                    dropped_analysis += 1
            context = context + [answer] + users[t + 1:t + 2]
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
    first = [len(render_prompt(tok, split_turns(p["messages"])[0] + split_turns(p["messages"])[1][:1]))
             for p in read_jsonl(root / "lengths" / "prompts" / "train.jsonl")]
    limit = max(first) + 4  # every first turn fits, no second turn does (it holds a whole answer more)
    stats, run = regenerate(demo, "lengths", "data.max_new_tokens=64", f"data.max_prompt_tokens={limit}")
    seqs = read_sequences(run)
    assert stats["num_skipped_long"] == 0 and [s["turn"] for s in seqs] == [0] * 6
    assert stats["num_turns_not_answered"] == 6 * (TURNS - 1)


def test_answer_message_reads_harmony_channels_and_plain_text(demo):
    _, _, model, tok = demo
    eos = eos_token_ids(model, tok)
    ids = tok.encode("<|channel|>analysis<|message|>Think a bit.<|end|><|start|>assistant<|channel|>final"
                     "<|message|>It is 4.<|return|>", add_special_tokens=False)
    assert answer_message(tok, ids, eos) == {"role": "assistant", "content": "It is 4.", "thinking": "Think a bit."}
    final_only = tok.encode("<|channel|>final<|message|>Yes.<|return|>", add_special_tokens=False)
    assert answer_message(tok, final_only, eos) == {"role": "assistant", "content": "Yes."}
    assert torch.equal(torch.tensor(ids), torch.tensor(tok.encode(tok.decode(ids), add_special_tokens=False)))


def test_plan_counts_turns_and_renders_prompts_from_the_prompts_stage(demo, tmp_path):
    """`eyas plan --run RUN` on a run whose prompts stage alone is done (no GPU needed yet): the answered
    turns per conversation are those regeneration then answers, and each turn's prompt is the
    template's rendering of the conversation so far, every earlier answer counted as its kept part
    (harmony: the final channel, an assumed share of the assumed answer length); turns whose prompt
    would pass data.max_prompt_tokens are not counted, as regeneration does not ask them."""
    import shutil

    from eyas.plan import Assumptions, plan, render

    stats, run = regenerate(demo, "plan", "data.max_new_tokens=64")
    only = tmp_path / "prompts-only"
    shutil.copytree(run / "prompts", only / "prompts")
    _, prompts, _, tok = demo
    a = Assumptions()
    new = a.new_token_fraction * 64
    kept = a.kept_answer_fraction_harmony * new  # the demo target's template is harmony: analysis dropped

    def by_hand(limit: int) -> tuple[int, float]:  # (sequences, mean prompt tokens) over the training conversations
        n, total = 0, 0.0
        for row in read_jsonl(only / "prompts" / "train.jsonl"):
            system, users = split_turns(row["messages"])
            context = system
            for t, user in enumerate(users):
                context = context + [user]
                length = len(render_prompt(tok, context)) + t * kept
                if length > limit:
                    break
                n, total = n + 1, total + length
                context = context + [{"role": "assistant", "content": ""}]
        return n, total / n

    over = BASE + [f"data.prompts={prompts}", "data.max_new_tokens=64", "data.num_prompts=600"]
    p = plan(load_recipe("demo", over), "1xH100", run_dir=only)
    n, mean_prompt = by_hand(load_recipe("demo", over).data.max_prompt_tokens)
    conversations = len(read_jsonl(only / "prompts" / "train.jsonl"))
    assert n == conversations * TURNS  # every turn fits: what regeneration answered
    assert p["sequences"] == 600 * stats["num_sequences"] // stats["num_conversations"] == 600 * TURNS
    assert p["mean_tokens"] == pytest.approx(mean_prompt + new) and p["tokens"] == pytest.approx(1800 * (mean_prompt + new))
    assert p["stages_measured"] == ["prompts"] and p["measured"] == []
    text = render(load_recipe("demo", over), p)
    assert f"data: 600 conversations x 3.00 answered turns = 1,800 sequences x {mean_prompt + new:,.0f} tokens" in text
    assert f"hold each earlier answer as {kept:,.0f} tokens" in text
    # a prompt limit that only the first turns fit under: the later turns are not counted
    limit = int(by_hand(10**9)[1])
    cut, cut_mean = by_hand(limit)
    short = plan(load_recipe("demo", over + [f"data.max_prompt_tokens={limit}"]), "1xH100", run_dir=only)
    assert conversations <= cut < conversations * TURNS
    assert short["sequences"] == round(600 * cut / conversations) and short["mean_tokens"] == pytest.approx(cut_mean + new)
