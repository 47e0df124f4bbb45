"""Checkpoint choice by replayed τ (train.keep_best): test-split τ of the final draft and of the one whose
tuning-split validation was best, at several epoch counts.

    python benchmarks/bench_keep_best.py --recipe recipes/smollm2-135m.yaml --out runs/bench-keep-best \
        [--epochs 2 8] [--seeds 0] [--validations 8] [--data RUN] [key.sub=value ...]

The recipe's prompts, regeneration and capture run once in OUT/_base (or are linked from --data, a run
that has them), and its vocab is counted there on the training split (data/splits.py). Each (epochs E,
seed S) trains in OUT/e<E>-s<S> with train.epochs=E, train.seed=S, train.val_seed=0 (every run validates on
the same tuning conversations), train.keep_best and train.val_every set for --validations validations
per run. Both of its drafts (checkpoint-final and checkpoint-best) then run in eyas's loop on the test split
(the recipe's eval prompts: nothing was tuned on them) at the recipe's eval.k, greedy, in one eval
(OUT/eval). Prints one JSON line per run (the validations' replayed τ by step, the kept step) and the table:
per E, the test-split τ of the final and the kept draft, each seed's and their mean.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_defaults import BASE_STAGES, link_stages, loop_drafts

from eyas.infra import io, layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe


def base_run(args) -> Path:
    """OUT/_base: the recipe's data stages (prompts, regeneration and capture linked from --data when given),
    and the vocab counted on the training split."""
    base = Path(args.out) / "_base"
    if args.data:
        link_stages(base, Path(args.data), BASE_STAGES[:3])
    recipe = load_recipe(args.recipe, [*args.overrides, "train.val_seed=0"])
    run_all(recipe, base, stages=BASE_STAGES, progress=True)
    return base


def steps_per_epoch(recipe, base: Path) -> int:
    """The optimizer steps of one epoch of `recipe` over the base run's capture (as training counts them)."""
    from eyas.data.shards import ShardDataset
    from eyas.data.splits import held_out_split, run_groups
    from eyas.train.packing import plan_rows
    from eyas.train.schedule import updates_per_epoch

    tr = recipe.train
    seqs = ShardDataset(base / "capture")
    train_ids = held_out_split(tr, run_groups(base, len(seqs)))[0]
    rows = plan_rows([seqs.lengths[i] for i in train_ids], tr.max_length, tr.pack, tr.seed, tr.pack_length)
    return updates_per_epoch(len(rows), tr.batch_size, tr.grad_accum, 1)


def train(args, base: Path, epochs: int, seed: int) -> dict:
    """OUT/e<E>-s<S> trained with train.keep_best -> its row: the validations by step and the kept one."""
    run = Path(args.out) / f"e{epochs}-s{seed}"
    over = [*args.overrides, f"train.epochs={epochs}", f"train.seed={seed}", "train.val_seed=0"]
    recipe = load_recipe(args.recipe, over)
    every = max(1, steps_per_epoch(recipe, base) * epochs // args.validations)
    recipe = load_recipe(args.recipe, [*over, "train.keep_best=true", f"train.val_every={every}"])
    link_stages(run, base, BASE_STAGES)
    run_all(recipe, run, stages=(*BASE_STAGES, "train"), progress=True)
    done = layout.read_done(run, "train")
    best, k = done["best"], recipe.eval.k
    vals = [e for e in io.read_jsonl(run / "train" / "log.jsonl") if "val" in e]
    return {
        "run": str(run),
        "epochs": epochs,
        "seed": seed,
        "steps": done["steps"],
        "val_every": every,
        "train_s": done.get("run_wall_s", done["wall_s"]),  # a resumed run: all its processes
        f"replayed_tau_k{k}_by_step": {e["step"]: round(e["val"][best["metric"]][k - 1], 4) for e in vals},
        "kept_step": best["step"],
    }


def loop(args, rows: list[dict]) -> dict[str, float]:
    """Both drafts of every run in eyas's loop on the test split, greedy, at eval.k -> {draft: tau}."""
    drafts = []
    for r in rows:
        name = Path(r["run"]).name
        drafts += [(f"{name}-final", f"{r['run']}/{layout.FINAL_CHECKPOINT}")]
        drafts += [(f"{name}-kept", f"{r['run']}/{layout.BEST_CHECKPOINT}")]
    recipe = load_recipe(args.recipe, args.overrides)
    tau = loop_drafts(recipe, Path(args.out) / "eval", Path(args.out) / "_base", drafts, [0.0])
    return {d: t for (d, _), t in tau.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/smollm2-135m.yaml")
    p.add_argument("--out", default="runs/bench-keep-best")
    p.add_argument("--data", default=None, help="a run whose prompts, regeneration and capture to link")
    p.add_argument("--epochs", type=int, nargs="+", default=[2, 8])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--validations", type=int, default=8, help="validations per run (train.val_every)")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value) for every run")
    args = p.parse_args(argv)
    base = base_run(args)
    rows = []
    for epochs in args.epochs:
        for seed in args.seeds:
            rows.append(train(args, base, epochs, seed))
            print(json.dumps(rows[-1]), flush=True)
    tau = loop(args, rows)
    print(f"\ntest-split tau at k={load_recipe(args.recipe, args.overrides).eval.k}, greedy, in eyas's loop")
    print(f"{'epochs':<8}{'final':>24}{'kept (replayed tau)':>28}   kept step / steps")
    for epochs in args.epochs:
        mine = [r for r in rows if r["epochs"] == epochs]
        cells = []
        for which in ("final", "kept"):
            each = [tau[f"{Path(r['run']).name}-{which}"] for r in mine]
            cells.append(f"{sum(each) / len(each):.3f} (" + "/".join(f"{t:.3f}" for t in each) + ")")
        kept = ", ".join(f"{r['kept_step']}/{r['steps']}" for r in mine)
        print(f"{epochs:<8}{cells[0]:>24}{cells[1]:>28}   {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
