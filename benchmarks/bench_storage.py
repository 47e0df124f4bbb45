"""What compact capture storage costs: bytes per token and the tau the trained draft gets.

    python benchmarks/bench_storage.py [key.sub=value ...] [--recipe recipes/demo.yaml]
        [--out runs/bench-storage]
        [--formats same:final same:topk fp8:topk int6:topk int4:topk] [--topk 32]

Each format is `aux_format:teacher` (data/compact.py). The prompts and regeneration are run once
(OUT/base); each format then captures, builds the vocab, trains and evaluates in OUT/<format>, with
everything else from the recipe. Prints one row per format: bytes per token measured on this
recipe's target and computed at gpt-oss-120b size (3 aux states + teacher, H = 2880), the share of
the bf16 `same:final` bytes, tau at the recipe's eval k, and its change against `same:final`.
Everything runs in this process, one format after another (CPU: several minutes per format).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from eyas.data.compact import bytes_per_token
from eyas.infra import layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

GPT_OSS_120B = {"n_aux": 3, "hidden": 2880}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/demo.yaml")
    p.add_argument("--out", default="runs/bench-storage")
    p.add_argument(
        "--formats", nargs="+", default=["same:final", "same:topk", "fp8:topk", "int6:topk", "int4:topk"]
    )
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value) for every format")
    args = p.parse_args(argv)
    bad = [f for f in args.formats if f.count(":") != 1]
    if bad:
        p.error(f"--formats: {bad} are not AUX_FORMAT:TEACHER (recipe overrides go before the options)")
    out = Path(args.out)
    base = out / "base"
    run_all(load_recipe(args.recipe, args.overrides), base, stages=("prompts", "regenerate"))

    rows = []
    for fmt in args.formats:
        aux_format, teacher = fmt.split(":")
        recipe = load_recipe(
            args.recipe,
            [
                *args.overrides,
                f"capture.aux_format={aux_format}",
                f"capture.teacher={teacher}",
                f"capture.teacher_topk={args.topk}",
            ],
        )
        run = out / fmt.replace(":", "-")
        if not run.exists():
            run.mkdir(parents=True)
            for stage in ("prompts", "regenerate"):
                shutil.copytree(base / stage, run / stage)
        t0 = time.perf_counter()
        run_all(recipe, run, stages=("capture", "vocab", "train", "eval"))
        cap, ev = layout.read_done(run, "capture"), layout.read_done(run, "eval")
        dtype_bytes = 2 if recipe.capture.dtype != "float32" else 4
        rows.append(
            {
                "format": fmt,
                "bytes_per_token": cap["bytes_per_token"],
                "gpt_oss_120b_bytes": bytes_per_token(
                    GPT_OSS_120B["n_aux"], GPT_OSS_120B["hidden"], aux_format, teacher, args.topk, dtype_bytes
                ),
                "tau": ev["acceptance_length"],
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    ref = next((r for r in rows if r["format"] == "same:final"), rows[0])
    print(
        f"\n{'format':<12} {'B/token (this target)':>22} {'B/token gpt-oss-120b':>21} {'share':>6} "
        f"{'tau':>7} {'vs ' + ref['format']:>15}"
    )
    for r in rows:
        print(
            f"{r['format']:<12} {r['bytes_per_token']:>22.1f} {r['gpt_oss_120b_bytes']:>21,d} "
            f"{r['gpt_oss_120b_bytes'] / ref['gpt_oss_120b_bytes']:>6.3f} {r['tau']:>7.3f} "
            f"{100 * (r['tau'] / ref['tau'] - 1):>+14.2f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
