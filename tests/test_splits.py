"""The three splits (data/splits.py): whole conversations held out for tuning, the vocab counted without
them, training refusing a vocab counted on another split, and the tuning split as the loop's prompts."""

import hashlib
import json
import shutil

import pytest
from data_fixtures import make_tiny_target

from eyas.data.splits import (
    held_out_split,
    run_groups,
    same_split,
    split_record,
    split_validation,
    tuning_prompts,
)
from eyas.data.vocab import run_vocab
from eyas.infra.errors import InputError
from eyas.infra.layout import mark_done
from eyas.recipes.load import load_recipe
from eyas.recipes.schema import TrainSection
from eyas.train.trainer import split_groups


def write_run(run, convs: dict[str, list[list[int]]], prompt_len: int = 2):
    """A run's prompts (train.jsonl) and regeneration: conversation id -> its turns' token ids."""
    (run / "prompts").mkdir(parents=True)
    (run / "regenerate").mkdir()
    prompts = [
        {"id": c, "messages": [{"role": "user", "content": f"q{c}-{t}"} for t in range(len(turns))]}
        for c, turns in convs.items()
    ]
    (run / "prompts" / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    rows = [
        {
            "id": c if t == 0 else f"{c}/{t}",
            "conversation": c,
            "turn": t,
            "input_ids": ids,
            "prompt_len": prompt_len,
            "finished": True,
        }
        for c, turns in convs.items()
        for t, ids in enumerate(turns)
    ]
    (run / "regenerate" / "part-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    mark_done(run, "regenerate", {})


def test_validation_split_is_disjoint_and_seeded():
    one_each = [str(i) for i in range(100)]  # single-turn: a conversation per sequence
    tr, va = split_validation(one_each, 0.05, seed=1)
    assert (
        len(va) == 5
        and sorted(tr + va) == list(range(100))
        and (tr, va) == split_validation(one_each, 0.05, 1)
    )
    assert split_validation(one_each, 0.05, 2)[1] != va
    assert split_validation(one_each[:20], 0.02, 0)[1]
    assert split_validation(one_each[:5], 0.0, 0) == ([0, 1, 2, 3, 4], [])


def test_a_conversation_is_held_out_whole():
    """40 conversations of 1-4 turns, their sequences interleaved (capture order is by length): every
    conversation's turns fall on one side, and 10% of the conversations (4) are held out."""
    groups = [f"c{i % 40}" for i in range(100)]
    tr, va = split_validation(groups, 0.1, seed=0)
    held = {groups[i] for i in va}
    assert len(held) == 4 and sorted(tr + va) == list(range(100))
    assert not held & {groups[i] for i in tr}
    assert va == [i for i, g in enumerate(groups) if g in held]


def test_val_seed_holds_out_the_same_conversations_for_every_seed():
    """train.val_seed: the held-out split no longer follows train.seed (seeds compared on one split)."""
    groups = [str(i) for i in range(100)]
    assert held_out_split(TrainSection(seed=3, val_fraction=0.05), groups) == split_validation(
        groups, 0.05, 3
    )
    fixed = [held_out_split(TrainSection(seed=s, val_seed=0, val_fraction=0.05), groups) for s in (0, 1, 2)]
    assert fixed == [split_validation(groups, 0.05, 0)] * 3


def test_vocab_counts_the_training_split_only_and_training_checks_it(tmp_path):
    """Conversation "b"'s tokens (7s) are held out at val_fraction 0.34 and seed 0 (one of three): the vocab
    never counts them, and a training split seeded otherwise is refused by name."""
    target = make_tiny_target(tmp_path / "target", num_layers=4)
    run = tmp_path / "run"
    write_run(run, {"a": [[1, 1, 3, 3]], "b": [[1, 1, 7, 7, 7], [1, 1, 7, 7, 7, 7, 7]], "c": [[1, 1, 5]]})
    tr = {"val_fraction": 0.34, "val_seed": 0}
    recipe = load_recipe({"target": {"model": str(target)}, "vocab": {"draft_vocab_size": 2}, "train": tr})
    groups = run_groups(run, 4)
    assert groups == ["c", "a", "b", "b"]  # capture order: shortest first
    assert {groups[i] for i in held_out_split(recipe.train, groups)[1]} == {"b"}
    stats = run_vocab(recipe, run, progress=False)
    assert stats["num_tokens"] == 3 and stats["num_distinct_tokens"] == 2  # 3, 3, 5: no 7
    digest = hashlib.sha256(b"b").hexdigest()[:16]  # which conversations: their sorted ids, hashed
    assert stats["split"] == {
        "val_fraction": 0.34,
        "split_seed": 0,
        "num_tuning_conversations": 1,
        "tuning_digest": digest,
    }
    assert split_groups(recipe.train, run, 4) == groups
    other = TrainSection(val_fraction=0.34, val_seed=1)
    if held_out_split(other, groups)[1] == held_out_split(recipe.train, groups)[1]:
        pytest.fail("seed 1 holds out the same conversation: pick another seed for this test")
    with pytest.raises(InputError, match=r"vocab: counted with the held-out split .* set train.val_seed"):
        split_groups(other, run, 4)
    with pytest.raises(RuntimeError, match="the regenerate stage holds 4 sequences, the training data 5"):
        run_groups(run, 5)
    # the same settings and count, other conversations held out (the run re-regenerated under new names):
    # the counts agree, the digest does not
    shutil.rmtree(run / "prompts")
    shutil.rmtree(run / "regenerate")
    write_run(run, {"a": [[1, 1, 3, 3]], "e": [[1, 1, 7, 7, 7], [1, 1, 7, 7, 7, 7, 7]], "c": [[1, 1, 5]]})
    ours = split_record(recipe.train, run_groups(run, 4))
    assert ours["num_tuning_conversations"] == 1 and ours["tuning_digest"] != digest
    with pytest.raises(InputError, match=r"vocab: counted with the held-out split"):
        split_groups(recipe.train, run, 4)
    # a vocab recorded before the digest: judged on what it recorded
    assert same_split({k: v for k, v in stats["split"].items() if k != "tuning_digest"}, ours)


def test_tuning_prompts_are_the_held_out_conversations_first_prompts(tmp_path):
    """The loop's tuning prompts: each held-out conversation's first user turn, less one that a trained
    conversation starts with too."""
    run = tmp_path / "run"
    write_run(run, {c: [[1, 1, 2], [1, 1, 2, 2]] for c in "abcdefgh"})
    recipe = load_recipe({"target": {"model": "unused"}, "train": {"val_fraction": 0.25, "val_seed": 0}})
    groups = run_groups(run, 16)
    held = sorted({groups[i] for i in held_out_split(recipe.train, groups)[1]})
    trained = sorted(set(groups) - set(held))
    assert len(held) == 2 and len(trained) == 6
    rows = [json.loads(x) for x in (run / "prompts" / "train.jsonl").read_text().splitlines()]
    for r in rows:  # every conversation's own first turn, but a trained one starts as held[0] does
        r["messages"][0]["content"] = f"first {held[0] if r['id'] == trained[0] else r['id']}"
    (run / "prompts" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = tuning_prompts(recipe, run)
    assert got == [[{"role": "user", "content": f"first {held[1]}"}]]  # the first user turn only


def test_the_loop_takes_the_split_by_name(tmp_path):
    """`eyas eval --split tuning` measures the tuning conversations' first prompts; a prompt set named with
    it, or the train split, is refused."""
    from eyas.eval.evaluate import resolve_benchmarks

    run = tmp_path / "run"
    write_run(run, {c: [[1, 1, 2]] for c in "abcd"})
    recipe = load_recipe({"target": {"model": "unused"}, "train": {"val_fraction": 0.5, "val_seed": 0}})
    (bench,) = resolve_benchmarks(recipe, run, None, "tuning")
    assert (
        bench.name == "tuning" and bench.messages == tuning_prompts(recipe, run) and len(bench.messages) == 2
    )
    with pytest.raises(InputError, match="--split tuning takes the run's own"):
        resolve_benchmarks(recipe, run, [("mt", "mt-bench")], "tuning")
    with pytest.raises(InputError, match="eval split 'train'"):
        resolve_benchmarks(recipe, run, None, "train")


def test_benchmarks_refuse_to_tune_on_the_test_split(capsys):
    """bench_defaults compares a table's choices and bench_anchors sweeps lr only on the tuning split."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_anchors
    import bench_defaults

    bench_defaults.refuse_tuning_on_test("tuning", [("lm_head", "random"), ("lm_head", "target")])
    bench_defaults.refuse_tuning_on_test("test", [("lm_head", "target"), ("optim", "muon")])
    with pytest.raises(
        SystemExit, match="would compare 2 choices of lm_head on prompts nothing may be tuned"
    ):
        bench_defaults.refuse_tuning_on_test("test", [("lm_head", "random"), ("lm_head", "target")])
    args = ["--run", "r", "--lr", "specforge=1e-4,3e-4", "--lr", "eyas=3e-3"]
    assert bench_anchors.parse([*args, "--split", "tuning"]).lr == {
        "eyas": [3e-3],
        "speculators": [None],
        "specforge": [1e-4, 3e-4],
    }
    with pytest.raises(SystemExit):
        bench_anchors.parse([*args, "--split", "test"])
    assert "--split test: --lr sweeps specforge on prompts nothing may be tuned on" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_anchors.parse(["--run", "r", "--lr", "peer=1e-3", "--split", "tuning"])
    assert "--lr peer=1e-3: expected TRAINER=LR" in capsys.readouterr().err
