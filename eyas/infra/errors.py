"""Expected failures, and the one way the `eyas` command reports them.

An expected failure prints one line on stderr, `eyas: error: <what, which file or key, what to do>`,
and exits non-zero:

    InputError  exit 2    bad recipe values, missing or unreadable files and models, a stage run
                          before the stage it needs, an engine refusal at export, no hub token
    RunError    exit 1    a runtime failure: unreachable hub or server, corrupt data, a full disk
    SIGINT / SIGTERM      exit 130 / 143 (128 + the signal), after keeping what is complete
                          (eyas/infra/interrupts.py)

`--debug` (or EYAS_DEBUG=1) prints the traceback of an expected failure too. Anything else is a
bug and keeps its traceback (exit 1). The hub token is masked in everything this prints.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator

from tqdm import tqdm

from eyas.infra.interrupts import Interrupted


class EyasError(Exception):
    """A failure the user can act on; the message names the input and the fix."""

    status = 1


class InputError(EyasError):
    """Bad input: a recipe value, a file or model that is missing or unreadable, a stage out of order."""

    status = 2


class BadInputFile(InputError, ValueError):
    """A file the user gave (prompts, a recipe) that cannot be parsed; the message names the file and line."""


class RunError(EyasError):
    """A runtime failure: an unreachable hub or server, corrupt data."""

    status = 1


class CorruptData(RunError):
    """A file a stage wrote fails its size, header or checksum check."""


def disk_full(e: BaseException) -> bool:
    """An OSError that says the disk (or the quota) is full."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def causes(e: BaseException) -> Iterator[BaseException]:
    """`e`, then what it was raised from or during, outermost first."""
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def disk_full_message(e: OSError) -> str:
    where = f" writing {e.filename}" if e.filename else ""
    return (
        f"no space left on device{where}; free space there (or point --out at a larger disk) and re-run the "
        "same command: finished files and parts are kept and the stage resumes"
    )


def as_input(e: Exception) -> Exception:
    """A ValueError / OSError from a command (export, import, publish, plan) as an eyas error with its own
    message: a bad value or a missing path is bad input; any other OSError (the hub or a server unreachable,
    an I/O error) a runtime failure. An eyas error or a full disk stays as it is."""
    if isinstance(e, EyasError) or disk_full(e):
        return e
    missing = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
    if isinstance(e, ValueError) or (isinstance(e, OSError) and type(e) in missing):
        return InputError(str(e))
    return RunError(str(e))


def secrets() -> list[str]:
    """Values that must never be printed: the hub token (HF_TOKEN, or the one `hf auth login` stored)."""
    found = [os.environ.get(k) for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")]
    try:
        from huggingface_hub import get_token

        found.append(get_token())
    except Exception:  # noqa: BLE001  (no hub library or an unreadable token file: nothing to mask)
        pass
    return [s for s in found if s and len(s) >= 8]


def redact(text: str) -> str:
    for s in secrets():
        text = text.replace(s, "***")
    return text


def debugging(argv: list[str]) -> tuple[bool, list[str]]:
    """(--debug given or EYAS_DEBUG=1, argv without --debug)."""
    rest = [a for a in argv if a != "--debug"]
    return len(rest) != len(argv) or os.environ.get("EYAS_DEBUG", "") not in ("", "0"), rest


def _say(message: str) -> None:
    _end_progress_bars()
    line = " ".join(redact(message).split())  # one line, whatever the message held
    print(f"eyas: error: {line}", file=sys.stderr, flush=True)


def _end_progress_bars() -> None:
    """Close the progress bars a failure left open: each ends its line, so the error line is one of its own
    (it was printed after the bar, on the bar's line)."""
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def report_failures(fn: Callable[[], int], debug: bool = False) -> int:
    """Run `fn` (a command) and turn an expected failure into one line and its exit status."""
    try:
        return int(fn() or 0)
    except EyasError as e:
        if debug:
            _traceback()
        _say(str(e))
        return e.status
    except (Interrupted, KeyboardInterrupt) as e:
        if debug:
            _traceback()
        if not isinstance(e, Interrupted):
            e = Interrupted(signal.SIGINT)
        kept = e.kept or "the parts finished before it are kept"
        _say(f"interrupted by {signal.Signals(e.signum).name}: {kept}; re-run the same command to continue")
        return e.status
    except Exception as e:  # noqa: BLE001
        if disk_full(e):
            if debug:
                _traceback()
            _say(disk_full_message(e))
            return 1
        _traceback()  # a bug: its traceback, with the token masked
        return 1


def _traceback() -> None:
    print(redact(traceback.format_exc()), file=sys.stderr, end="", flush=True)
