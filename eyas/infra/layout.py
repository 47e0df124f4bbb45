"""A run directory's layout and its stage markers, in one place.

    RUN/recipe.yaml                   the resolved recipe (eyas/pipeline.py writes it)
    RUN/<stage>/                      each stage's outputs (eyas/infra/stages.py lists the stages)
    RUN/<stage>/DONE.json             written last: what the stage returned, and "files": the size and
                                      xxh3-64 checksum of every file it wrote ({path from RUN: record})
    RUN/train/checkpoint-final/       the final eyas checkpoint (train/checkpoint.py)
    RUN/report.json, RUN/report.md    measured acceptance (the eval stage, with its plots beside them)
    RUN/stage_costs.json              each stage's wall time and peak memory (`eyas run`, a stage's command;
                                      `eyas eval` with options under "eval OPTIONS")

A re-run skips a stage whose marker exists. Everything under RUN/<stage>/ is listed in its marker
(hidden temporary files and trackers' folders aside), plus what the stage wrote outside it (eval's
report and plots). The capture's shards get their records as each is written and carry them in
capture/index.json, so the stage's end does not read terabytes again (`known`).

Imports of eyas: the stage table (a leaf), eyas.infra.io (atomic writes) and eyas.infra.errors; none imports
back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import xxhash
import yaml

from eyas.infra.errors import InputError
from eyas.infra.io import read_json, write_json
from eyas.infra.stages import STAGE_ORDER

RECIPE = "recipe.yaml"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
STAGE_COSTS = "stage_costs.json"
DONE = "DONE.json"
FINAL_CHECKPOINT = Path("train") / "checkpoint-final"
BEST_CHECKPOINT = (
    Path("train") / "checkpoint-best"
)  # train.keep_best: the validation's best, beside the final
TRACKER_DIRS = ("wandb", "tensorboard", "trackio")  # trackers' folders: theirs, not checksummed
ALGO = "xxh3_64"
CHUNK = 16 << 20


def stage_dir(run_dir: str | Path, stage: str) -> Path:
    """RUN/<stage>/, created."""
    d = Path(run_dir) / stage
    d.mkdir(parents=True, exist_ok=True)
    return d


def marker(run_dir: str | Path, stage: str) -> Path:
    return Path(run_dir) / stage / DONE


def is_done(run_dir: str | Path, stage: str) -> bool:
    return marker(run_dir, stage).is_file()


def read_done(run_dir: str | Path, stage: str) -> dict:
    """A finished stage's info (what its function returned; not the file list)."""
    info = read_json(marker(run_dir, stage))
    info.pop("files", None)
    return info


def require_done(run_dir: str | Path, needed: str, stage: str) -> None:
    """Fail clearly when `stage` is run before the stage it reads from."""
    if not is_done(run_dir, needed):
        raise InputError(
            f"{run_dir}: the {needed} stage has not finished; run it before {stage} "
            f"(`eyas {needed} {run_dir}`, or `eyas run` for every stage)"
        )


def mark_done(
    run_dir: str | Path,
    stage: str,
    info: dict,
    outside: tuple[str | Path, ...] = (),
    known: dict[str, dict] | None = None,
) -> None:
    """Write RUN/<stage>/DONE.json: `info` and "files", the record of each file the stage wrote
    (`outside`: its files elsewhere in the run; `known`: checksums taken while writing)."""
    write_json(marker(run_dir, stage), {**info, "files": stage_files(run_dir, stage, outside, known)})


def file_record(path: str | Path) -> dict:
    """{"size": bytes, "xxh3_64": hex digest} of a file, read in 16 MiB chunks."""

    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return {"size": os.path.getsize(path), ALGO: h.hexdigest()}


def stage_files(
    run_dir: str | Path,
    stage: str,
    outside: tuple[str | Path, ...] = (),
    known: dict[str, dict] | None = None,
) -> dict[str, dict]:
    """The records of a finished stage's files: RUN/<stage>/** (not DONE.json, not hidden files or links)
    and `outside` (paths the stage wrote elsewhere in the run). `known` ({path from the run dir: record},
    checksums taken when the files were written) is used where the size still agrees."""
    run_dir = Path(run_dir)
    paths = []
    for root, dirs, files in os.walk(run_dir / stage):
        # trackers' folders are theirs (wandb's service may append to its logs after the run ends)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in TRACKER_DIRS)
        paths += [Path(root) / f for f in sorted(files) if not f.startswith(".")]
    paths = [p for p in paths if p.name != DONE or p.parent != run_dir / stage]
    paths += [run_dir / p for p in outside]
    records = {}
    for p in paths:
        if p.is_symlink() or not p.is_file():
            continue
        rel = p.relative_to(run_dir).as_posix()
        rec = (known or {}).get(rel, {})
        ok = ALGO in rec and rec.get("size") == p.stat().st_size
        records[rel] = {"size": rec["size"], ALGO: rec[ALGO]} if ok else file_record(p)
    return records


def is_checkpoint(path: Path) -> bool:
    """An eyas checkpoint: config.json with an "eyas" block next to model.safetensors."""
    config = path / "config.json"
    if not config.is_file() or not (path / "model.safetensors").is_file():
        return False
    return "eyas" in json.loads(config.read_text())


def run_checkpoint(run_dir: str | Path) -> Path:
    """The run's draft: RUN/train/checkpoint-best where training kept one (train.keep_best: the checkpoint
    with the highest tuning-split tau of its validations), else RUN/train/checkpoint-final."""
    best = Path(run_dir) / BEST_CHECKPOINT
    return best if is_checkpoint(best) else Path(run_dir) / FINAL_CHECKPOINT


def resolve_checkpoint(run_or_checkpoint: str | Path) -> Path:
    """RUN -> the run's draft (`run_checkpoint`); a checkpoint directory is returned as is."""
    path = Path(run_or_checkpoint)
    if is_checkpoint(path):
        return path
    if is_checkpoint(run_checkpoint(path)):
        return run_checkpoint(path)
    raise FileNotFoundError(
        f"{path}: neither an eyas checkpoint (config.json with an 'eyas' block + model.safetensors) "
        f"nor a run directory with one at {FINAL_CHECKPOINT}; give a finished run or its {FINAL_CHECKPOINT}, "
        "or convert a published draft with `eyas import` first"
    )


@dataclass
class FinishedRun:
    """What `eyas export` / `eyas publish` take from a finished run."""

    root: Path
    checkpoint: Path
    report: dict
    recipe_text: str
    recipe: dict
    stages: dict[str, dict] = field(default_factory=dict)


def load_run(run: str | Path) -> FinishedRun:
    """A run with its draft (`run_checkpoint`), report.json and recipe.yaml (all required for publishing)."""

    root = Path(run)
    checkpoint = run_checkpoint(root)
    if not is_checkpoint(checkpoint):
        raise FileNotFoundError(f"{root}: no final checkpoint at {checkpoint} (has training finished?)")
    if not (root / REPORT_JSON).is_file():
        raise FileNotFoundError(f"{root}: no {REPORT_JSON} (run the eval stage before publishing)")
    if not (root / RECIPE).is_file():
        raise FileNotFoundError(f"{root}: no {RECIPE}")
    recipe_text = (root / RECIPE).read_text()
    # the stages' info, not their file lists: the model card shows these
    stages = {stage: read_done(root, stage) for stage in STAGE_ORDER if is_done(root, stage)}
    return FinishedRun(
        root=root,
        checkpoint=checkpoint,
        report=read_json(root / REPORT_JSON),
        recipe_text=recipe_text,
        recipe=yaml.safe_load(recipe_text) or {},
        stages=stages,
    )
