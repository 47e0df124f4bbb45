"""SIGINT and SIGTERM: stop without losing finished work.

- Regeneration, capture and the other stages: SIGTERM (a scheduler preempting the job) raises
  `Interrupted` just as Ctrl-C raises KeyboardInterrupt, so the write in progress is dropped by its
  `atomic_path` and a re-run continues from the last complete part (`signals_raise`).
- Training: the first signal is noted (`StopRequest`); the loop finishes the optimizer step, every
  process agrees to stop, the training state is saved atomically and the run exits; a re-run resumes
  from that step. A second Ctrl-C stops at once.

`eyas` reports an interrupt as one line and exits 128 + the signal (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT / SIGTERM (a BaseException, like KeyboardInterrupt: `except Exception` does not swallow it)."""

    def __init__(self, signum: int, kept: str | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.kept = kept  # what was saved, for the one-line report

    @property
    def status(self) -> int:
        return 128 + self.signum


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM (a scheduler preempting the job) raises Interrupted like Ctrl-C raises KeyboardInterrupt,
    so a write in progress is dropped by its `atomic_path` rather than left behind."""

    def handler(signum, frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler) if _main_thread() else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextmanager
def held() -> Iterator[None]:
    """SIGINT / SIGTERM that arrive inside the block are delivered when it ends, so writes that belong
    together (a capture shard and the index that lists it) are not cut between them. Main thread only
    (elsewhere the block runs as it is)."""
    if not _main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in arrived[:1]:
            signal.raise_signal(s)  # now, to the handlers that were there before


class StopRequest:
    """SIGINT / SIGTERM during training: the first one is noted (`signum`) and the training loop saves its
    state at the end of the step and stops. A second Ctrl-C raises at once (Interrupted); more SIGTERMs are
    ignored: Slurm signals every process of a job step and torchrun passes its own on, so each rank may
    get two. (torchrun kills its workers 30 s after passing a signal on: the step and the save must fit.)"""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def _handler(self, signum, frame):
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise Interrupted(signum)
            return
        self.signum = signum
        # os.write, not print: a handler that prints while tqdm writes would raise "reentrant call"
        os.write(
            2,
            f"\n[eyas] {signal.Signals(signum).name}: saving the training state at the end of this "
            "step (Ctrl-C again to stop at once)\n".encode(),
        )

    def __enter__(self) -> StopRequest:
        if _main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            if h is not None:  # (None: a handler not installed from Python, which cannot be put back)
                signal.signal(s, h)

    def agreed(self, any_process: Callable[[bool], bool] | None = None) -> bool:
        """Whether to stop after this step: this process was signalled, or (`any_process`, a collective
        that ORs a flag over the processes) any other was: every process stops at the same step."""
        mine = self.signum is not None
        if any_process is None:
            return mine
        stop = any_process(mine)
        if stop and self.signum is None:
            self.signum = signal.SIGTERM  # the launcher told the others
        return stop


def ignore_in_worker(worker_id: int) -> None:
    """DataLoader worker_init_fn: workers leave SIGINT / SIGTERM to the training process, which stops them
    after saving (a worker that died on Ctrl-C first would fail the step being finished)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
