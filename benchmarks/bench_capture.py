"""Capture tokens/s, side by side in one run: transformers (HF), vLLM offline, and vLLM online (producers
feeding training as it runs), with the share of training's micro-batches that waited for data.

    python benchmarks/bench_capture.py [--recipe recipes/demo.yaml] [--out runs/bench-capture]
        [--replicas 1] [--producer-cores 0] [key.sub=value ...]

The prompts and regeneration run once (OUT/base, the recipe's own backend). Then, each from a copy of it:
    hf        capture.backend hf: the target in this process (every core), tokens/s of its forwards
    vllm      capture.backend vllm: `--replicas` vLLM workers (every core between them), tokens/s from the
              moment they are up
    train     offline training on the HF capture: tokens/s trained (the speed online has to feed)
    online    capture.mode online, capture.backend vllm: a producer on `--producer-cores` (vllm.devices),
              training on the other cores: tokens/s trained, the micro-batches that were not ready when
              training asked for them, and the seconds it waited
Training runs `train.max_steps` steps (the recipe's, or an override). One process, one stage after another.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from eyas.infra import layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe


def fresh(base: Path, out: Path, name: str) -> Path:
    """A copy of the base run (prompts and regenerate done) to run the rest in."""
    run = out / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(base, run, ignore=shutil.ignore_patterns("capture", "vocab", "train", "eval*", "report*"))
    return run


def trained_tok_s(run: Path) -> tuple[float, dict]:
    """Training's tokens/s in its step loop (setup, the producers' start and the end not counted), and its
    DONE record."""
    info = layout.read_done(run, "train")
    return info["tokens_seen"] / (info.get("run_loop_s") or info["loop_s"]), info  # a resumed run: all parts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/demo.yaml")
    p.add_argument("--out", default="runs/bench-capture")
    p.add_argument("--replicas", type=int, default=1, help="vLLM capture workers (offline)")
    p.add_argument("--producer-cores", default="0", help="CPU cores of the online producer, e.g. 0 or 0,1")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value)")
    args = p.parse_args(argv)
    out, over = Path(args.out), list(args.overrides)
    base = out / "base"
    run_all(load_recipe(args.recipe, over), base, stages=("prompts", "regenerate"))
    rows = {}
    runs = {
        "hf": ["capture.backend=hf"],
        "vllm": ["capture.backend=vllm", f"vllm.replicas={args.replicas}"],
    }
    for name, extra in runs.items():
        run = fresh(base, out, name)
        run_all(load_recipe(args.recipe, over + extra), run, stages=("capture",))
        stats = layout.read_done(run, "capture")
        rows[name] = {"capture_tok_s": stats["tokens_per_s"], "tokens": stats["num_tokens"]}
    train = out / "train"
    shutil.rmtree(train, ignore_errors=True)
    shutil.copytree(out / "hf", train)
    run_all(load_recipe(args.recipe, over), train, stages=("vocab", "train"))
    rows["train"] = {"train_tok_s": trained_tok_s(train)[0]}
    online = fresh(base, out, "online")
    cores = f"vllm.devices=[{args.producer_cores}]"
    t0 = time.time()
    run_all(
        load_recipe(args.recipe, over + ["capture.mode=online", "capture.backend=vllm", cores]),
        online,
        stages=("capture", "vocab", "train"),
    )
    tok_s, info = trained_tok_s(online)
    fed = info["online"]
    rows["online"] = {
        "train_tok_s": tok_s,
        "waited": f"{fed['waited']} of {fed['micro_batches']}",
        "waited_s": round(fed["waited_s"], 2),
        "wall_s": round(time.time() - t0, 1),
    }
    print(json.dumps(rows, indent=1))
    (out / "bench-capture.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
