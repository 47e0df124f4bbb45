"""The draft architecture options and losses at demo scale, each alone and combined: tau at k = 1..4
(greedy and temperature 1), draft parameters and train time.

    python benchmarks/bench_draft_options.py [--out runs/bench-options] [--options ...] [--num-prompts 16]

Every option is the demo recipe (recipes/demo.yaml, the built-in tiny gpt-oss target) with the
overrides below. The prompts, regeneration, capture and vocab stages are run once and shared
(copied) by every option that does not change them; `last-layer-aux` captures again, with the
aux ids of nvidia/gpt-oss-120b-Eagle3-v3's shape (ending at N, the last layer's output before the
final norm; the demo target has N = 4 layers, so [2, 3, 4] against the default [1, 2, 3]).

Each option is evaluated in the serving loop on the demo's held-out prompts (the first
--num-prompts of them), concurrency 1, chains of k = 1..4, greedy (checked lossless) and at
temperature 1 (speculative sampling). Prints one JSON line per option, then the table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from eyas.infra import layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

SHARED = ("prompts", "regenerate", "capture", "vocab")
OPTIONS = {
    "baseline": [],
    "norm_before_fc": ["draft.norm_before_fc=true"],
    "norm_before_residual": ["draft.norm_before_residual=true"],
    "two-layers": ["draft.num_layers=2"],
    "last-layer-aux": ["capture.aux_layer_ids=[2,3,4]"],
    "loss-lk": ["train.loss=lk"],
    "loss-ce": ["train.loss=ce"],
}


def prepare(out: Path, name: str, over: list[str], base: Path) -> Path:
    """The option's run directory: the shared stages copied from `base` (capture and vocab only when the
    option keeps the aux ids)."""
    run = out / name
    if run.exists():
        return run
    keep = SHARED if not any(o.startswith("capture.") for o in over) else ("prompts", "regenerate")
    run.mkdir(parents=True)
    for stage in keep:
        shutil.copytree(base / stage, run / stage)
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench-options")
    p.add_argument(
        "--options",
        nargs="+",
        default=list(OPTIONS),
        help=f"names from {list(OPTIONS)}, or NAME=OVERRIDE,OVERRIDE for a combination",
    )
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--num-prompts", type=int, default=16)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from eyas.eval.evaluate import run_eval

    base = out / "_shared"
    run_all(load_recipe("recipes/demo.yaml"), base, stages=SHARED, progress=False)
    rows = []
    for spec in args.options:
        name, _, combo = spec.partition("=")
        over = re.split(r",(?=[a-z_]+\.)", combo) if combo else OPTIONS[name]  # commas inside [..] stay
        recipe = load_recipe("recipes/demo.yaml", over + [f"eval.num_prompts={args.num_prompts}"])
        run = prepare(out, name, over, base)
        t0 = time.perf_counter()
        run_all(recipe, run, stages=("prompts", "regenerate", "capture", "vocab", "train"), progress=False)
        train = layout.read_done(run, "train")
        report = run_eval(
            recipe,
            run,
            ks=args.ks,
            temperatures=args.temperatures,
            concurrency=[1],
            force=True,
            progress=False,
        )
        tau = {
            f"T{r['temperature']:g}@k{r['k']}": r["acceptance_length"]
            for r in report["results"]
            if r.get("k") is not None
        }
        lossless = all(r["lossless"] for r in report["results"] if r.get("lossless") is not None)
        rows.append(
            {
                "option": name,
                "overrides": over,
                "params": train["trainable_parameters"],
                "train_s": train.get("run_wall_s", train["wall_s"]),
                "tau": tau,
                "lossless": lossless,
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    cols = [(t, k) for t in args.temperatures for k in args.ks]
    print(
        f"\n{'option':<22} {'params':>9} {'train s':>8} "
        + " ".join(f"{f'T={t:g} k={k}':>10}" for t, k in cols)
    )
    for r in rows:
        cells = [r["tau"].get(f"T{t:g}@k{k}") for t, k in cols]
        print(
            f"{r['option']:<22} {r['params']:>9,d} {r['train_s']:>8.0f} "
            + " ".join(f"{c:>10.3f}" if c is not None else f"{'-':>10}" for c in cells)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
