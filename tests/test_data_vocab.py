"""The draft vocabulary: top-k selection and the d2t/t2d mapping."""

import json

import pytest
import torch
from data_fixtures import make_tiny_target
from safetensors.torch import load_file

from eyas.data.regenerate import read_sequences
from eyas.data.vocab import build_vocab, count_tokens, run_vocab
from eyas.infra.layout import mark_done
from eyas.recipes.load import load_recipe
from eyas.recipes.schema import RecipeError


def check_mapping(d2t, t2d):
    """Every draft id maps into t2d's True set, bijectively, in ascending target order."""
    targets = torch.arange(len(d2t)) + d2t
    assert t2d[targets].all()
    assert torch.equal(targets, torch.nonzero(t2d).flatten())  # bijection onto t2d's True set, ascending
    return targets


def test_top_k_exact_with_ties():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 5, 2, 0], dtype=torch.int64)
    d2t, t2d = build_vocab(counts, 4)
    # ranks: 2 (9), 5 (9), then the 5s: 0, 3, 7 -> ties go to the lower ids 0 and 3
    assert check_mapping(d2t, t2d).tolist() == [0, 2, 3, 5]
    assert d2t.tolist() == [0, 1, 1, 2] and d2t.dtype == torch.int64
    assert t2d.tolist() == [True, False, True, True, False, True, False, False, False, False]


def test_padding_with_lowest_unused_ids():
    counts = torch.zeros(12, dtype=torch.int64)
    counts[[9, 4, 11]] = torch.tensor([3, 1, 7])
    d2t, t2d = build_vocab(counts, 6)
    assert check_mapping(d2t, t2d).tolist() == [0, 1, 2, 4, 9, 11]  # 3 seen + lowest unseen 0, 1, 2


def test_random_round_trip_and_bounds():
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (1000,), generator=g)
    d2t, t2d = build_vocab(counts, 100)
    targets = check_mapping(d2t, t2d)
    assert t2d.sum() == 100
    assert counts[targets].min() >= counts[~t2d].max()  # nothing left out counts more than what was kept
    assert torch.equal(build_vocab(counts, 1000)[1], torch.ones(1000, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"draft_vocab_size 1001 must be in \[1, 1000\]"):
        build_vocab(counts, 1001)


def write_regen(run_dir, seqs):
    (run_dir / "regenerate").mkdir(parents=True)
    (run_dir / "regenerate" / "part-00000.jsonl").write_text("".join(json.dumps(s) + "\n" for s in seqs))
    mark_done(run_dir, "regenerate", {})


def test_count_tokens_and_run_vocab(tmp_path):
    target = make_tiny_target(tmp_path / "target", num_layers=4)
    run = tmp_path / "run"
    write_regen(
        run,
        [
            {"id": "0", "input_ids": [1, 2, 3, 7, 7, 9], "prompt_len": 3, "finished": False},
            {"id": "1", "input_ids": [7, 5, 9, 9, 9], "prompt_len": 1, "finished": True},
        ],
    )
    counts = count_tokens(read_sequences(run), 20)
    assert counts.tolist() == [0] * 5 + [1, 0, 2, 0, 4] + [0] * 10  # only generated tokens count
    recipe = load_recipe(
        {"target": {"model": str(target)}, "vocab": {"draft_vocab_size": 2}, "train": {"val_fraction": 0}}
    )
    stats = run_vocab(recipe, run, progress=False)
    saved = load_file(run / "vocab" / "vocab.safetensors")
    assert check_mapping(saved["d2t"], saved["t2d"]).tolist() == [7, 9]
    assert saved["counts"][:20].tolist() == counts.tolist()
    assert stats["coverage"] == 6 / 7 and stats["num_tokens"] == 7 and stats["num_distinct_tokens"] == 3
    with pytest.raises(ValueError, match="regen sequence 0: token id 9 outside the target's vocabulary of 8"):
        count_tokens(read_sequences(run), 8)
    write_regen(tmp_path / "run2", [])
    too_big = load_recipe({"target": {"model": str(target)}, "vocab": {"draft_vocab_size": 10_000}})
    with pytest.raises(RecipeError, match="vocab.draft_vocab_size: 10000 > the target's vocab size"):
        run_vocab(too_big, tmp_path / "run2", progress=False)
