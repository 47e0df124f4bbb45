"""Stages in order, each skipped when its outputs are complete, so a re-run resumes.

    prompts -> regenerate -> capture -> vocab -> train -> eval

A run directory holds `recipe.yaml` (the resolved recipe) and one folder per stage with a
`DONE.json` written last. Re-running with a recipe that changes what a finished stage made
is refused, naming the keys, rather than silently mixing two runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml

from eyas.data.sharding import current_shard, wait_until
from eyas.infra import io, layout
from eyas.infra.peak_memory import StagePeak, describe, stage_peak
from eyas.infra.stages import SHARDED, STAGE_KEYS, STAGE_ORDER, stage_fn
from eyas.recipes.load import changed_keys, check_against_target, dump_recipe, load_recipe
from eyas.recipes.schema import Recipe, RecipeError

T = TypeVar("T")


def check_target(recipe: Recipe) -> list[int]:
    """Recipe checks that need the target's config.json (layer count, vocab). -> aux layer ids."""
    from eyas.data.target import load_target_config, text_config  # lazy: torch

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

    check_target(recipe)
    run_dir = prepare_run(recipe, run_dir)
    shard = current_shard()
    times = {}
    for stage in stages:
        if done_already(run_dir, stage):
            continue
        print(f"[eyas] {stage} ...", flush=True)
        wall_s, peak = run_stage(recipe, run_dir, stage, shard, progress)
        times[stage] = round(wall_s, 1)
        print(f"[eyas] {stage}: {times[stage]} s{describe(peak)}", flush=True)
    return times


def done_already(run_dir: Path, stage: str) -> bool:
    """Whether `stage` is finished in `run_dir`; if so, say it is skipped (nothing run, nothing measured)."""
    if layout.is_done(run_dir, stage):
        print(f"[eyas] {stage}: done already, skipped")
        return True
    return False


def run_stage(recipe: Recipe, run_dir: Path, stage: str, shard, progress: bool) -> tuple[float, StagePeak]:
    """One stage not yet done, for `eyas run` and a stage's own command alike: run (a launched rank > 0 waits
    for rank 0 on a stage that is not shared out), timed, its peak memory measured and recorded in
    RUN/stage_costs.json (not by one `--shard I/N` slice of several: its time is not the stage's)
    -> (wall seconds, peak)."""

    def run():
        if shard.launched and shard.index > 0 and stage not in SHARDED + ("train",):
            wait_until(lambda: layout.is_done(run_dir, stage), f"rank 0 to finish the {stage} stage")
        else:
            stage_fn(stage)(
                recipe, run_dir, progress=progress, **({"shard": shard} if stage in SHARDED else {})
            )

    _, wall_s, peak = measured(run)
    if shard.launched or shard.count == 1:
        record_stage_cost(run_dir, stage, round(wall_s, 3), peak, shard.index)
    return wall_s, peak


def measured(fn: Callable[[], T]) -> tuple[T, float, StagePeak]:
    """fn() timed, its peak memory measured (eyas/infra/peak_memory.py) -> (its result, wall s, peak)."""
    t0 = time.perf_counter()
    with stage_peak() as peak:
        out = fn()
    return out, time.perf_counter() - t0, peak


def record_stage_cost(run_dir: Path, stage: str, wall_s: float, peak: StagePeak, rank: int) -> None:
    """RUN/stage_costs.json: {stage: {wall_s, peak_bytes, anon_bytes, children_bytes}} as `eyas run` or the
    stage's own command measured them (rank 0's; a stage run again replaces its entry, a resumed one with its
    last part's; eyas/infra/peak_memory.py says what each counts), to set beside `eyas plan`. `stage` may
    carry the options of a command that ran other work than the recipe's stage ("eval --concurrency 8":
    `eyas eval`'s), an entry of its own beside the stage's."""
    if rank > 0:
        return
    path = Path(run_dir) / layout.STAGE_COSTS
    try:  # a record beside the run: the stage is done either way, so a bad file only warns
        costs = io.read_json(path) if path.is_file() else {}
        costs[stage] = {
            "wall_s": wall_s,
            "peak_bytes": peak.own_bytes,
            "anon_bytes": peak.anon_bytes,
            "children_bytes": peak.children_bytes,
        }
        io.write_json(path, costs)
    except (OSError, ValueError) as e:
        print(f"[eyas] warning: {stage}'s cost not recorded in {path}: {type(e).__name__}: {e}", flush=True)


def answers_run(source, messages: list[list[dict]], out: Path, overrides: list[str] = ()) -> Path:
    """`messages` (each the chat the target answers) answered greedily by the target of recipe `source` (a
    path or raw dict, with `overrides`) in its eval dtype up to eval.max_new_tokens, single-turn, then
    captured, in run directory `out` (resumed when its capture is done) -> the capture directory."""
    if not layout.is_done(out, "capture"):
        out.mkdir(parents=True, exist_ok=True)
        io.write_jsonl(out / "probe-prompts.jsonl", [{"messages": m} for m in messages])
        ev = load_recipe(source, list(overrides)).eval
        over = [
            f"data.prompts=[{{source: {out / 'probe-prompts.jsonl'}, name: probe}}]",
            f"data.num_prompts={len(messages)}",
            "data.num_eval_prompts=0",
            "data.max_turns=1",
            f"data.max_new_tokens={ev.max_new_tokens}",
            "data.temperature=0",
            "data.backend=hf",
            *([f"target.dtype={ev.target_dtype}"] if ev.target_dtype else []),
            *overrides,
        ]
        run_all(load_recipe(source, over), out, stages=("prompts", "regenerate", "capture"), progress=False)
    return out / "capture"
