"""Each stage's peak memory, for `eyas run`'s stage lines and `RUN/stage_costs.json` (set beside `eyas plan`).

Linux keeps a process's peak resident set (VmHWM in /proc/self/status) and lets the process reset it
(`echo 5 > /proc/self/clear_refs`, Linux >= 4.0), so a stage's peak is its own, not the run's so far.
vLLM's processes are not in it (its engine is not a child the kernel reports a peak for once it is
stopped; `eyas plan` leaves them out too: vllm.gpu_memory_utilization). Elsewhere (macOS, no /proc) the
peak is None and the stage lines leave memory out.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass
class StagePeak:
    own_bytes: int | None = None  # this process's peak resident set during the stage


def own_peak_bytes() -> int | None:
    """VmHWM of this process, bytes (None where /proc is not there)."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


def reset_own_peak() -> bool:
    """Start this process's VmHWM again from its current resident set -> whether it could."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


@contextmanager
def stage_peak():
    """with stage_peak() as peak: ... -> peak.own_bytes filled in on exit."""
    peak = StagePeak()
    own = reset_own_peak()
    try:
        yield peak
    finally:
        peak.own_bytes = own_peak_bytes() if own else None


def describe(peak: StagePeak) -> str:
    """', peak memory 6.1 GB (eyas's process)' or ''."""
    return "" if peak.own_bytes is None else f", peak memory {peak.own_bytes / 1e9:,.1f} GB (eyas's process)"
