"""Training's saved state, for resuming: RUN/train/state/ holds what accelerate saves (the draft, the
optimizer and the scheduler, sharded under FSDP2 / DeepSpeed, each process's RNG) and step.json
({"step": optimizer steps done, "tokens": tokens trained on over all processes, "elapsed_s" and "loop_s": the
run's wall seconds up to this save and those of its step loops, over every process that has worked on it (a
process's time after its last save is redone, and counted, by the next: the seconds match the tokens),
"layout": what dealt the rows and set the schedule: the process count, the
launcher and the recipe's draft and train sections}).

A resume is exact or refused: with another process count or launcher, or another value of a key that deals
rows or shapes the schedule and the model (train.grad_accum, train.sequence_parallel, train.batch_size,
train.epochs, ...; every draft and train key but RESUME_FREE's), the re-deal would repeat some rows and skip
others, so `load_latest` raises one error naming the keys, before anything is loaded.

Every process writes its part into one temporary directory (the main process's `io.atomic_dir`, its
name broadcast to the others), which replaces state/ once all have finished: a kill or a full disk
mid-save leaves the last complete state. A kill between atomic_dir's two renames leaves that state
where atomic_dir swapped it out (`io.previous_dir`), which a resume reads too.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from eyas.infra import io
from eyas.infra.errors import InputError
from eyas.recipes.load import changed_keys

if TYPE_CHECKING:
    from accelerate import Accelerator

STEP = "step.json"
# keys a resumed run may change: when to log, save and validate, and how to compute; not what is trained
RESUME_FREE = {
    "train.log_every",
    "train.save_every",
    "train.val_every",
    "train.report_to",
    "train.num_workers",
    "train.compile",
    "train.checkpoint_layer",
    "train.attention",
}
LAYOUT_SECTIONS = ("draft", "train")


def resume_layout(num_processes: int, launcher: str, recipe: dict) -> dict:
    """What a saved state must be resumed with: the process count, the launcher (ddp, fsdp, deepspeed: each
    saves its own state layout), the recipe's draft and train sections."""
    return {
        "num_processes": num_processes,
        "launcher": launcher,
        "recipe": {s: recipe[s] for s in LAYOUT_SECTIONS},
    }


def layout_changes(saved: dict, now: dict) -> list[str]:
    """'num_processes 2 -> 1', 'train.grad_accum 1 -> 2': how `now` differs from a saved layout, but in
    RESUME_FREE's keys."""

    out = [
        f"{key} {saved[key]} -> {now[key]}"
        for key in ("num_processes", "launcher")
        if key in saved and saved[key] != now[key]  # (a state saved before the launcher was recorded)
    ]
    for key in changed_keys(saved["recipe"], now["recipe"], LAYOUT_SECTIONS):
        if key not in RESUME_FREE:
            sec, _, rest = key.partition(".")
            a, b = _get(saved["recipe"][sec], rest), _get(now["recipe"][sec], rest)
            out.append(f"{key} {a} -> {b}")
    return out


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def sum_over_processes(acc: Accelerator, n: int) -> int:
    """`n` summed over every process (a collective: every process must call it)."""
    return int(acc.reduce(torch.tensor(n, device=acc.device), reduction="sum"))


def latest_state(state_dir: Path) -> Path | None:
    """The last complete saved state: `state_dir`, or the one a kill mid-swap left in `previous_dir`."""
    for d in (state_dir, io.previous_dir(state_dir)):
        if (d / STEP).is_file():
            return d
    return None


class Saved(NamedTuple):
    """What a resumed run starts from (step.json)."""

    step: int  # optimizer steps done
    tokens: int  # this process's share of the tokens trained on: all of them on the main process, else 0
    tokens_all: int  # the tokens trained on over all processes (every process knows it)
    elapsed_s: float  # the run's wall seconds up to the save (0.0 in a state saved before it was recorded)
    loop_s: float  # the seconds of its step loops up to the save (likewise)


def load_latest(acc: Accelerator, state_dir: Path, layout: dict) -> Saved | None:
    """Load the last saved state into `acc` (and the objects registered with it) -> where it stood; None:
    nothing saved.
    A state saved with another `layout` (resume_layout) raises InputError naming the changes, loading nothing
    (a state saved before layouts were recorded is taken as it is)."""

    found = latest_state(state_dir)
    if found is None:
        return None
    saved = json.loads((found / STEP).read_text())
    if "layout" in saved and (changes := layout_changes(saved["layout"], layout)):
        raise InputError(
            f"{state_dir}: saved at step {saved['step']} with another layout ({'; '.join(changes)}): "
            "resuming would deal rows and the schedule differently. Run with the saved values, or delete "
            f"{state_dir} to train from the start"
        )
    acc.load_state(str(found))
    tokens = saved.get("tokens", 0)
    main = tokens if acc.is_main_process else 0
    return Saved(saved["step"], main, tokens, saved.get("elapsed_s", 0.0), saved.get("loop_s", 0.0))


def save_state(
    acc: Accelerator, state_dir: Path, step: int, tokens: int, layout: dict, seconds: tuple[float, float]
) -> None:
    """Save the training state at optimizer step `step` atomically (every process must call: each writes
    its part); `tokens`: this process's count, summed over the processes into step.json; `layout`:
    resume_layout's, which a resume must match; `seconds`: the run's wall seconds so far and its step loops'
    (the main process's are written)."""
    with _shared_temporary(acc, state_dir) as tmp:
        acc.save_state(str(tmp))
        seen = sum_over_processes(acc, tokens)  # also: every process has written its part
        if acc.is_main_process:
            elapsed_s, loop_s = (round(x, 2) for x in seconds)
            step_json = {
                "step": step,
                "tokens": seen,
                "elapsed_s": elapsed_s,
                "loop_s": loop_s,
                "layout": layout,
            }
            (tmp / STEP).write_text(json.dumps(step_json))
    if acc.is_main_process:
        shutil.rmtree(
            io.previous_dir(state_dir), ignore_errors=True
        )  # (left by a kill mid-swap, now superseded)
    acc.wait_for_everyone()


@contextmanager
def _shared_temporary(acc: Accelerator, state_dir: Path) -> Iterator[Path]:
    """The main process's `io.atomic_dir(state_dir)`, its temporary name broadcast to every process. A full
    disk raises OSError naming `state_dir`; the partial state goes, the last complete one stays."""
    from accelerate.utils import broadcast_object_list

    if acc.is_main_process:
        for d in _killed_saves(state_dir):
            shutil.rmtree(d, ignore_errors=True)
        with io.atomic_dir(state_dir) as tmp:
            broadcast_object_list([str(tmp)])
            yield tmp
        return
    tmp = Path(broadcast_object_list([None])[0])
    try:
        yield tmp
    except Exception as e:
        full = io.disk_full(e, state_dir.parent, state_dir)
        if full:
            shutil.rmtree(tmp, ignore_errors=True)
            raise full from e
        raise


def _killed_saves(state_dir: Path) -> list[Path]:
    """Temporary directories that saves killed before they finished left next to `state_dir`
    (`io.atomic_dir`'s `.state.*`; not `previous_dir`, which may hold the last complete state)."""
    found = state_dir.parent.glob(f".{state_dir.name}.*")
    return [d for d in found if d.is_dir() and d != io.previous_dir(state_dir)]
