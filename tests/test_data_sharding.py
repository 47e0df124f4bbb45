"""Sharded regeneration and capture (data/sharding.py): slices of one run dir, by `--shard I/N` or by
rank under torchrun (2 CPU processes), join to exactly the single-process result (the same parts, the
same sequences in the same order, the same captured tensors); a partial capture resumes only as the
slices it was started with."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from data_fixtures import one_thread, write_conversations  # noqa: F401  (one_thread: fixture)
from serve_process import free_port

from eyas.data.capture import run_capture
from eyas.data.prompts import run_prompts
from eyas.data.regenerate import read_sequences, run_regenerate
from eyas.data.sharding import Shard, balanced_ranges, current_shard, parse_shard, rank_gpus
from eyas.data.shards import ShardDataset, read_index
from eyas.infra.layout import is_done, read_done
from eyas.pipeline import prepare_run
from eyas.recipes.load import load_recipe
from eyas.recipes.schema import RecipeError

pytestmark = pytest.mark.usefixtures("one_thread")  # as the torchrun ranks (OMP_NUM_THREADS=1): same sums

# 18 conversations of 3 turns, one per batch: 3 parts of 8 batches (parts 0, 2 -> shard 0; part 1 -> shard 1)
OVERRIDES = [
    "target.dtype=float32",
    "target.device=cpu",
    "data.num_eval_prompts=2",
    "data.batch_size=1",
    "data.max_new_tokens=16",
    "capture.batch_size=4",
    "capture.shard_tokens=300",
]


def test_balanced_ranges_split_by_cost_in_order():
    assert balanced_ranges([1] * 10, 2) == [(0, 5), (5, 10)]
    assert balanced_ranges([1, 1, 1, 1, 6], 2) == [
        (0, 5),
        (5, 5),
    ]  # half the cost is reached at the last item
    assert balanced_ranges([5, 1, 1, 1, 1, 1], 3) == [(0, 1), (1, 3), (3, 6)]  # running 5 >= 10/3, 7 >= 20/3
    assert balanced_ranges([2, 2], 4) == [(0, 1), (1, 1), (1, 2), (2, 2)]
    assert balanced_ranges([3], 1) == [(0, 1)]


def test_shard_specs_and_rank_gpus(monkeypatch):
    assert parse_shard("1/4") == Shard(1, 4) and Shard(1, 4).label == "r1of4"
    for bad in ("4/4", "x", "1/0", "-1/2"):
        with pytest.raises(RecipeError, match="--shard"):
            parse_shard(bad)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert current_shard() == Shard(1, 2, launched=True) and current_shard("0/3") == Shard(0, 3)
    assert rank_gpus(1, 4, 8) == [2, 3] and rank_gpus(0, 8, 8) == [0] and rank_gpus(2, 3, 8) == [4, 5]
    with pytest.raises(RecipeError, match="2 visible GPUs"):
        rank_gpus(0, 4, 2)


@pytest.fixture(scope="module")
def single(tmp_path_factory, one_thread):
    """The prompts of 20 conversations, and the single-process regeneration and capture of them."""
    root = tmp_path_factory.mktemp("sharding")
    recipe = load_recipe("demo", OVERRIDES + [f"data.prompts={write_conversations(root / 'c.jsonl', 20)}"])
    prepare_run(recipe, root / "prompted")
    run_prompts(recipe, root / "prompted", progress=False)
    shutil.copytree(root / "prompted", root / "single")
    run_regenerate(recipe, root / "single", progress=False)
    run_capture(recipe, root / "single", progress=False)
    return root, recipe


def fresh(single, tmp_path, name):
    root, _ = single
    return shutil.copytree(root / "prompted", tmp_path / name)


def assert_same_capture(a, b):
    ia, ib = read_index(a / "capture"), read_index(b / "capture")
    assert (ia["num_sequences"], ia["num_tokens"]) == (ib["num_sequences"], ib["num_tokens"])
    da, db = ShardDataset(a / "capture"), ShardDataset(b / "capture")
    assert len(da) == len(db) == ia["num_sequences"]
    for i in range(len(da)):
        x, y = da[i], db[i]
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), f"sequence {i}"


def test_shards_by_flag_join_to_the_single_process_result(single, tmp_path):
    root, recipe = single
    run = fresh(single, tmp_path, "flag")
    first = run_regenerate(recipe, run, progress=False, shard="1/2")
    assert first["complete"] is False and not is_done(run, "regenerate")
    assert sorted(p.name for p in (run / "regenerate").glob("part-*")) == ["part-00001.jsonl"]
    stats = run_regenerate(recipe, run, progress=False, shard="0/2")  # the last to finish joins
    assert is_done(run, "regenerate") and stats["num_parts"] == 3
    assert [s["parts"] for s in stats["shards"]] == [[0, 2], [1]]
    expected = read_sequences(root / "single")
    assert (
        stats["num_conversations"] == 18 and stats["num_sequences"] == len(expected) > 18
    )  # later turns too
    assert read_sequences(run) == expected

    half = run_capture(recipe, run, progress=False, shard="1/2")
    assert half["complete"] is False and not (run / "capture" / "index.json").exists()
    with pytest.raises(RuntimeError, match="sharded 2 ways is partial"):
        run_capture(recipe, run, progress=False)
    with pytest.raises(RuntimeError, match=r"cannot be resumed as shard 0/3"):
        run_capture(recipe, run, progress=False, shard="0/3")
    other = load_recipe("demo", OVERRIDES + [f"data.prompts={recipe.data.prompts}", "capture.batch_size=2"])
    with pytest.raises(
        RuntimeError, match=r"slice was batches \[\d+, \d+\] when .* is batches \[\d+, \d+\] now"
    ):
        run_capture(
            other, run, progress=False, shard="1/2"
        )  # other batches: the slice would hold other sequences
    done = run_capture(recipe, run, progress=False, shard="0/2")
    assert done["capture_shards"] == 2 and is_done(run, "capture") and done["lm_head_max_rel_diff"] < 1e-3
    files = [s["file"] for s in read_index(run / "capture")["shards"]]
    assert files[0].startswith("shard-r0of2-") and files[-1].startswith("shard-r1of2-")
    assert_same_capture(root / "single", run)

    (run / "capture" / "DONE.json").unlink()  # a crash between the join and DONE: every slice is finished
    again = run_capture(recipe, run, progress=False, shard="1/2")  # nothing left to capture: it joins again
    assert is_done(run, "capture") and again["lm_head_max_rel_diff"] == done["lm_head_max_rel_diff"]
    assert_same_capture(root / "single", run)


def test_torchrun_ranks_share_regeneration_and_capture(single, tmp_path):
    root, _ = single
    run = fresh(single, tmp_path, "torchrun")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for stage in ("regenerate", "capture"):
        out = subprocess.run(
            [*launch, f"--master_port={free_port()}", "-m", "eyas", stage, str(run), "--no-progress"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert read_sequences(run) == read_sequences(root / "single")
    assert [s["shard"] for s in read_done(run, "regenerate")["shards"]] == ["0/2", "1/2"]
    assert read_done(run, "capture")["capture_shards"] == 2
    assert_same_capture(root / "single", run)
