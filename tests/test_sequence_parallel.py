"""Sequence parallelism (train/sequence_parallel.py): one packed row of >= 4K tokens spread over P = 2 and 4
CPU processes (gloo, torchrun) gives the loss, the counts, the replayed chains and the gradients of one
process over the whole row (tests/sp_worker.py runs both in the same processes): EAGLE-3's TTT (Ulysses) and
DFlash's blocks (the context gathered). Tolerances, fp32: the loss
within 1e-6 relative; every gradient within 2e-6 of its tensor's largest entry (measured <= 3e-7: the
all-to-all and all-reduce add in another order); counts and run_length exact."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed import ENV, free_port

WORKER = Path(__file__).with_name("sp_worker.py")
ALL_OPTIONS = ["num_layers=2", "norm_before_fc=1", "norm_before_residual=1", "norm_output=1"]
CASES = {
    # P, T (4099: padded to a multiple of P), options
    "P2-every-option-checkpointed": (2, 4099, [*ALL_OPTIONS, "checkpoint_layer=1"]),
    "P4-every-option": (4, 4096, ALL_OPTIONS),
    "P2-window-lk": (2, 4096, ["sliding_window=512", "loss=lk", "docs=9"]),  # a window: chunked attention
    # DFlash: the context gathered, each rank's shard of the anchors (random, and D-PACE; every one)
    "P2-dflash-anchors-dpace": (2, 4099, ["kind=dflash", "num_layers=2", "anchors=1200", "dpace=0.7"]),
    "P4-dflash-every-block-ce": (4, 4096, ["kind=dflash", "loss=ce", "checkpoint_layer=1"]),
    # one block a row: three of the four ranks run the idle block (times 0) and still take part
    "P4-dflash-one-block": (4, 4096, ["kind=dflash", "anchors=1"]),
}
COUNTED = {"P4-dflash-one-block": 1}  # the predictions counted at step 0 (default: over 1000)


@pytest.fixture(scope="module")
def results(deepspeed, tmp_path_factory) -> dict[str, dict]:
    """Every case's result, the cases of each P in one torchrun launch (its ranks import torch, eyas and
    DeepSpeed once) -> {case: result}; a launch that fails fails each of its cases with its stderr."""
    out, got = tmp_path_factory.mktemp("sp"), {}
    for P in sorted({p for p, _, _ in CASES.values()}):
        # DFlash's cases first: their context is gathered without DeepSpeed, which EAGLE-3's then start
        mine = {n: [T, o] for n, (p, T, o) in CASES.items() if p == P and "kind=dflash" in o}
        mine |= {n: [T, o] for n, (p, T, o) in CASES.items() if p == P and "kind=dflash" not in o}
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={P}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(WORKER),
            str(out),
            json.dumps(mine),
        ]
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
        for name in mine:  # a launch that did not exit 0 fails each of its cases, written or not
            f = out / f"{name}.json"
            ok = r.returncode == 0 and f.is_file()
            got[name] = (
                json.loads(f.read_text()) if ok else {"failed": f"exit {r.returncode}: {r.stderr[-3000:]}"}
            )
    return got


@pytest.mark.parametrize("case", CASES)
def test_a_row_over_p_processes_equals_one_process(results, case):
    res = results[case]
    assert "failed" not in res, res.get("failed")
    assert res["loss"][1] == pytest.approx(res["loss"][0], rel=1e-6)
    assert res["step_loss"][1] == pytest.approx(res["step_loss"][0], rel=1e-6)
    assert res["counts"][1] == res["counts"][0]
    assert res["counts"][0][0][0] == COUNTED[case] if case in COUNTED else res["counts"][0][0][0] > 1000
    assert res["sampled"][1] == pytest.approx(res["sampled"][0], rel=1e-6)
    assert res["run_length_equal"] and not res["missing"]
    for name, (diff, largest) in res["grads"].items():
        assert largest > 0 and diff <= 2e-6 * largest, name


def test_a_sequence_parallel_size_that_does_not_divide_the_heads_is_one_error_line(tmp_path):
    """train.sequence_parallel must divide the draft's heads (Ulysses gives each process whole heads)."""
    import yaml
    from data_fixtures import make_tiny_target, tiny_recipe, write_prompts

    from eyas.pipeline import run_all
    from eyas.recipes.load import load_recipe

    target = make_tiny_target(tmp_path / "target", num_layers=4)  # 4 heads, 2 key/value heads
    raw = tiny_recipe(target, write_prompts(tmp_path / "prompts.jsonl", 8))
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(raw))
    run = tmp_path / "run"
    run_all(
        load_recipe(tmp_path / "recipe.yaml"),
        run,
        stages=("prompts", "regenerate", "capture", "vocab"),
        progress=False,
    )
    r = subprocess.run(
        [sys.executable, "-m", "eyas", "train", str(run), "--no-progress", "train.sequence_parallel=3"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0 and not (run / "train" / "checkpoint-final").exists()
    errors = [x for x in r.stderr.splitlines() if x.startswith("eyas: error:")]
    assert errors == [
        "eyas: error: train.sequence_parallel=3 must divide the draft's attention heads "
        "(draft.num_attention_heads=4, draft.num_key_value_heads=2): each process attends over whole heads"
    ]
