"""Each stage's peak memory, for `eyas run`'s stage lines and `RUN/stage_costs.json` (set beside `eyas plan`),
written by `eyas run` and by a stage's own command alike.

Three numbers a stage, because on a CPU host they differ by gigabytes:

- `own_bytes`: eyas's process's peak resident set. Linux keeps it (VmHWM in /proc/self/status) and lets the
  process reset it (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0), so a stage's peak is its own, not the
  run's so far. It counts mapped file pages too: a safetensors checkpoint read through mmap is resident while
  it is read, though the kernel can drop those pages at any time (they are the file's, not the process's).
- `anon_bytes`: the peak of the process's anonymous memory (RssAnon: tensors, the heap), what it cannot give
  back; sampled every `SAMPLE_S` (the kernel keeps no peak of it), so a spike shorter than that can be missed.
- `children_bytes`: the peak sum of the anonymous memory of eyas's child processes and theirs, sampled the
  same way: a vLLM server eyas started (its API server, its engine core), DataLoader or compile workers (a
  forked child's copy-on-write pages count again there). Each sample lists /proc and reads the stat file of
  only the processes new since the last sample and of those whose parent has gone (a process's parent
  changes only when the parent ends: its children pass to init): reading all of them at every sample took
  5 ms with 70 processes on a 2-core AVX2 EPYC, 5% of a core; 0.1 ms so.

Before a stage, what earlier stages in the same process freed goes back to the system (`release_freed`: a
garbage collection, then glibc's `malloc_trim(0)`): glibc keeps freed heap pages resident, so a stage would
count the heap of the ones before. After the demo's training the process held 0.55 GB anonymous, 0.32 GB once
trimmed (libraries and live objects stay). The change was made after a prompts stage run in the process after
another run's training (bench_long_context.py's run_all) measured 5.9 GB where `eyas prompts` alone takes
0.9 GB (not re-measured since). Under another allocator (jemalloc preloaded) it releases nothing.

`eyas plan` prices the memory a stage needs, the anonymous kind. Elsewhere (macOS, no /proc) every number is
None and the stage lines leave memory out. psutil would read the same files; eyas reads them itself rather
than add a dependency for three fields.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
STATUS = PROC / "self" / "status"
CLEAR_REFS = PROC / "self" / "clear_refs"
SAMPLE_S = 0.1


@dataclass
class StagePeak:
    own_bytes: int | None = None  # this process's peak resident set during the stage (VmHWM)
    anon_bytes: int | None = None  # its anonymous memory's peak, sampled
    children_bytes: int | None = None  # its descendants' anonymous memory's peak (summed), sampled


def status_field(path: Path, field: str) -> int | None:
    """A `kB` field of a /proc/PID/status file, in bytes; None where it cannot be read."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def own_peak_bytes() -> int | None:
    """VmHWM of this process, bytes (None where /proc is not there)."""
    return status_field(STATUS, "VmHWM")


def reset_own_peak() -> bool:
    """Start this process's VmHWM again from its current resident set -> whether it could."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def release_freed() -> None:
    """Hand what this process has freed back to the system: Python's cycles collected, then glibc's free heap
    pages (malloc_trim(0): the top of the heap and, since glibc 2.8, free pages inside every arena). Where the
    C library has no malloc_trim (musl, macOS) only the collection runs."""
    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the process's own symbols: its C library's
    if trim is not None:
        trim(0)


def descendants(pid: int, parent_of: dict[int, int] | None = None) -> list[int]:
    """Every live process below `pid` (children, theirs, ...), from /proc/*/stat's parent field. `parent_of`,
    a cache kept between calls (pid -> parent), is brought up to date: a process new since the last call, or
    whose parent has ended (it was reparented), has its stat file read; one gone is dropped."""
    parent_of = {} if parent_of is None else parent_of
    live = {int(name) for name in os.listdir(PROC) if name.isdigit()}
    for gone in parent_of.keys() - live:
        del parent_of[gone]
    orphaned = {p for p, parent in parent_of.items() if parent and parent not in live}  # 0: none (init)
    for new in (live - parent_of.keys()) | orphaned:
        try:
            stat = (PROC / str(new) / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        parent_of[new] = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces
    found, frontier = [], [pid]
    while frontier:
        below = [p for p, pp in parent_of.items() if pp in frontier]
        found += below
        frontier = below
    return found


def children_anon_bytes(parent_of: dict[int, int] | None = None) -> int:
    """The anonymous memory of this process's descendants, summed, bytes (`parent_of`: descendants' cache)."""
    pids = descendants(os.getpid(), parent_of)
    return sum(status_field(PROC / str(p) / "status", "RssAnon") or 0 for p in pids)


class Sampler(threading.Thread):
    """Reads RssAnon of this process and its descendants every SAMPLE_S until stopped; keeps the peaks."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="eyas-peak-memory")
        self.stopped = threading.Event()
        self.anon = self.children = 0
        self.parent_of: dict[int, int] = {}  # every process's parent (descendants keeps it up to date)

    def sample(self) -> None:
        self.anon = max(self.anon, status_field(STATUS, "RssAnon") or 0)
        self.children = max(self.children, children_anon_bytes(self.parent_of))

    def run(self) -> None:
        while not self.stopped.wait(SAMPLE_S):
            self.sample()


@contextmanager
def stage_peak():
    """with stage_peak() as peak: ... -> peak's fields filled in on exit."""
    peak = StagePeak()
    release_freed()  # the earlier stages' freed heap is not this stage's
    own = reset_own_peak()
    sampler = Sampler() if own else None
    if sampler is not None:
        sampler.sample()
        sampler.start()
    try:
        yield peak
    finally:
        if sampler is not None:
            sampler.stopped.set()
            sampler.join()
            try:
                sampler.sample()
            except OSError:  # never in place of the stage's own exception
                pass
            peak.own_bytes = own_peak_bytes()
            peak.anon_bytes = sampler.anon or None  # None: no RssAnon (Linux < 4.5)
            peak.children_bytes = sampler.children


def describe(peak: StagePeak) -> str:
    """', peak memory 6.1 GB (eyas's process; 4.2 GB anonymous), child processes 9.0 GB' or ''."""
    if peak.own_bytes is None:
        return ""
    text = f", peak memory {peak.own_bytes / 1e9:,.1f} GB (eyas's process"
    text += f"; {peak.anon_bytes / 1e9:,.1f} GB anonymous)" if peak.anon_bytes else ")"
    return text + (f", child processes {peak.children_bytes / 1e9:,.1f} GB" if peak.children_bytes else "")
