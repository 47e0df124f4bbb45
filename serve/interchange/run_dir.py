"""Reading a finished eyas run directory (what `export` and `publish` take as input).

    RUN/recipe.yaml                    the resolved recipe
    RUN/train/checkpoint-final/        the final eyas checkpoint (train/checkpoint.py)
    RUN/report.json                    measured acceptance (eval stage)
    RUN/<stage>/DONE.json              per-stage stats (prompts, regenerate, capture, vocab, train)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eyas import io
from eyas.pipeline import STAGE_ORDER

FINAL_CHECKPOINT = Path("train") / "checkpoint-final"


def is_checkpoint(path: Path) -> bool:
    """An eyas checkpoint: config.json with an "eyas" block next to model.safetensors."""
    config = path / "config.json"
    if not config.is_file() or not (path / "model.safetensors").is_file():
        return False
    return "eyas" in json.loads(config.read_text())


def resolve_checkpoint(run_or_checkpoint: str | Path) -> Path:
    """RUN -> RUN/train/checkpoint-final; a checkpoint directory is returned as is."""
    path = Path(run_or_checkpoint)
    if is_checkpoint(path):
        return path
    if is_checkpoint(path / FINAL_CHECKPOINT):
        return path / FINAL_CHECKPOINT
    raise FileNotFoundError(
        f"{path}: neither an eyas checkpoint (config.json with an 'eyas' block + model.safetensors) "
        f"nor a run directory with one at {FINAL_CHECKPOINT}; give a finished run or its {FINAL_CHECKPOINT}, or "
        "convert a published draft with `eyas import` first")


@dataclass
class FinishedRun:
    root: Path
    checkpoint: Path
    report: dict
    recipe_text: str
    recipe: dict
    stages: dict[str, dict] = field(default_factory=dict)


def load_run(run: str | Path) -> FinishedRun:
    """A run with its final checkpoint, report.json and recipe.yaml (all required for publishing)."""
    root = Path(run)
    checkpoint = root / FINAL_CHECKPOINT
    if not is_checkpoint(checkpoint):
        raise FileNotFoundError(f"{root}: no final checkpoint at {checkpoint} (has training finished?)")
    report_path = root / "report.json"
    if not report_path.is_file():
        raise FileNotFoundError(f"{root}: no report.json (run the eval stage before publishing)")
    recipe_path = root / "recipe.yaml"
    if not recipe_path.is_file():
        raise FileNotFoundError(f"{root}: no recipe.yaml")
    recipe_text = recipe_path.read_text()
    stages = {}
    for stage in STAGE_ORDER:
        if io.is_done(root, stage):
            stages[stage] = io.read_done(root, stage)  # (not the file list: the model card shows these)
    return FinishedRun(root=root, checkpoint=checkpoint, report=json.loads(report_path.read_text()),
                       recipe_text=recipe_text, recipe=yaml.safe_load(recipe_text) or {}, stages=stages)
