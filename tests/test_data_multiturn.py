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
