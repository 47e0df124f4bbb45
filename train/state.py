"""Training's saved state, for resuming: RUN/train/state/ holds what accelerate saves (the draft, the
optimizer and the scheduler, sharded under FSDP2 / DeepSpeed, each process's RNG) and step.json
({"step": optimizer steps done, "tokens": tokens trained on over all processes}).

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
from typing import TYPE_CHECKING

import torch

from eyas import io

if TYPE_CHECKING:
    from accelerate import Accelerator

STEP = "step.json"


def sum_over_processes(acc: Accelerator, n: int) -> int:
    """`n` summed over every process (a collective: every process must call it)."""
    return int(acc.reduce(torch.tensor(n, device=acc.device), reduction="sum"))


def latest_state(state_dir: Path) -> Path | None:
    """The last complete saved state: `state_dir`, or the one a kill mid-swap left in `previous_dir`."""
    for d in (state_dir, io.previous_dir(state_dir)):
        if (d / STEP).is_file():
            return d
    return None


def load_latest(acc: Accelerator, state_dir: Path) -> tuple[int, int] | None:
    """Load the last saved state into `acc` (and the objects registered with it) -> (step, this process's
    share of the tokens: all of them on the main process, which carries the count); None: nothing saved."""
    found = latest_state(state_dir)
    if found is None:
        return None
    acc.load_state(str(found))
    saved = json.loads((found / STEP).read_text())
    return saved["step"], saved.get("tokens", 0) if acc.is_main_process else 0


def save_state(acc: Accelerator, state_dir: Path, step: int, tokens: int) -> None:
    """Save the training state at optimizer step `step` atomically (every process must call: each writes
    its part); `tokens`: this process's count, summed over the processes into step.json."""
    with _shared_temporary(acc, state_dir) as tmp:
        acc.save_state(str(tmp))
        seen = sum_over_processes(acc, tokens)  # also: every process has written its part
        if acc.is_main_process:
            (tmp / STEP).write_text(json.dumps({"step": step, "tokens": seen}))
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
