"""Stages in order, each skipped when its outputs are complete, so a re-run resumes.

    prompts -> regenerate -> capture -> vocab -> train -> eval

A run directory holds `recipe.yaml` (the resolved recipe) and one folder per stage with a
`DONE.json` written last. Re-running with a recipe that changes what a finished stage made
is refused, naming the keys, rather than silently mixing two runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from eyas import io, layout
from eyas.peak_memory import StagePeak, describe, stage_peak
from eyas.recipes.load import changed_keys, check_against_target, dump_recipe, load_recipe
from eyas.recipes.schema import Recipe, RecipeError
from eyas.stages import SHARDED, STAGE_KEYS, STAGE_ORDER, stage_fn


def check_target(recipe: Recipe) -> list[int]:
    """Recipe checks that need the target's config.json (layer count, vocab). -> aux layer ids."""
    from eyas.data.target import load_target_config, text_config

    cfg = text_config(load_target_config(recipe.target.model, recipe.target.trust_remote_code))
    return check_against_target(recipe, cfg.num_hidden_layers, cfg.vocab_size)


def prepare_run(recipe: Recipe, run_dir: str | Path, redo: tuple[str, ...] = ()) -> Path:
    """Create the run dir or check that its saved recipe agrees with `recipe` on finished stages
    (except the stages in `redo`, which the caller is about to run again: `eyas eval`)."""
    run_dir = Path(run_dir)
    saved_path = run_dir / layout.RECIPE
    if saved_path.is_file():
        saved = yaml.safe_load(saved_path.read_text())
        new = recipe.to_dict()
        for stage in STAGE_ORDER:
            if not layout.is_done(run_dir, stage) or stage in redo:
                continue
            changed = changed_keys(saved, new, STAGE_KEYS[stage])
            if changed:
                raise RecipeError(
                    f"{run_dir}: stage '{stage}' is finished with a different recipe ({', '.join(changed)} "
                    f"changed); use a new --out directory, or delete {run_dir / stage} to redo it"
                )
    run_dir.mkdir(parents=True, exist_ok=True)
    io.write_text(saved_path, dump_recipe(recipe))
    return run_dir


def run_all(recipe: Recipe, run_dir: str | Path, stages=STAGE_ORDER, progress: bool = True) -> dict:
    """Every stage in order. Under torchrun / accelerate launch every rank runs regenerate, capture and
    train (each its share); prompts, vocab and eval run on rank 0 while the other ranks wait."""
    from eyas.data.sharding import current_shard, wait_until

    check_target(recipe)
    run_dir = prepare_run(recipe, run_dir)
    shard = current_shard()
    times = {}
    for stage in stages:
        if layout.is_done(run_dir, stage):
            print(f"[eyas] {stage}: done already, skipped")
            continue
        print(f"[eyas] {stage} ...", flush=True)
        t0 = time.perf_counter()
        with stage_peak() as peak:
            if shard.launched and shard.index > 0 and stage not in SHARDED + ("train",):
                wait_until(lambda: layout.is_done(run_dir, stage), f"rank 0 to finish the {stage} stage")
            else:
                stage_fn(stage)(
                    recipe, run_dir, progress=progress, **({"shard": shard} if stage in SHARDED else {})
                )
        wall_s = time.perf_counter() - t0
        times[stage] = round(wall_s, 1)
        print(f"[eyas] {stage}: {times[stage]} s{describe(peak)}", flush=True)
        record_stage_cost(run_dir, stage, round(wall_s, 3), peak, shard.index)
    return times


def record_stage_cost(run_dir: Path, stage: str, wall_s: float, peak: StagePeak, rank: int) -> None:
    """RUN/stage_costs.json: {stage: {wall_s, peak_bytes, anon_bytes, children_bytes}} as `eyas run` measured
    them (rank 0's; a stage run again replaces its entry; eyas/peak_memory.py says what each counts), to set
    beside `eyas plan`."""
    if rank > 0:
        return
    path = Path(run_dir) / layout.STAGE_COSTS
    costs = io.read_json(path) if path.is_file() else {}
    costs[stage] = {
        "wall_s": wall_s,
        "peak_bytes": peak.own_bytes,
        "anon_bytes": peak.anon_bytes,
        "children_bytes": peak.children_bytes,
    }
    io.write_json(path, costs)


def recipe_and_run(source: str, out: str | None, overrides: list[str]) -> tuple[Recipe, Path]:
    """`source` is a recipe file/name, or a run dir holding recipe.yaml (then it is the run dir too)."""
    src = Path(source)
    if src.is_dir() and (src / layout.RECIPE).is_file():
        return load_recipe(src / layout.RECIPE, overrides), Path(out) if out else src
    recipe = load_recipe(source, overrides)
    return recipe, Path(out) if out else Path("runs") / recipe.name
