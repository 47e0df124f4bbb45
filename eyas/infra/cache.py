"""Directories eyas builds once and keeps in its cache: the demo target (data/demo_target/build.py) and
dequantized GGUF targets (data/gguf.py).

    cache_root()      $EYAS_CACHE, else ~/.cache/eyas
    build_once(...)   the directory, built unless a complete build with the same parameters is there

A build goes into a temporary sibling directory (`.NAME.tmp-PID`) that is renamed into place when it is
complete, its marker file written last by the build itself ({"build": params, ...}); so a crash or a
failed build never leaves a half-written directory under the final name, and the next call deletes the
temporaries of processes that no longer run. One build at a time per cache root: a second process (a
test process, another rank) waits on a lock on the root directory itself (no lock file left behind) and
then finds the first one's build.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """`$EYAS_CACHE`, else `~/.cache/eyas`."""
    root = os.environ.get("EYAS_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "eyas"


def is_complete(path: Path, marker: str, params: dict) -> bool:
    """Whether `path` holds a finished build made with `params` (its marker file records them)."""
    try:
        return json.loads((path / marker).read_text())["build"] == params
    except (OSError, ValueError, KeyError, TypeError):
        return False


def remove_stale(path: Path) -> None:
    """Delete the temporary siblings of `path` (`.NAME.tmp-PID`, `.NAME.old-PID`) left by processes that
    no longer run."""
    parent, name = path.parent, path.name
    for stray in [*parent.glob(f".{name}.tmp-*"), *parent.glob(f".{name}.old-*")]:
        try:
            os.kill(int(stray.name.rsplit("-", 1)[1]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(stray, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def build_once(
    path: Path, marker: str, params: dict, build: Callable[[Path], object], force: bool = False
) -> bool:
    """Make `path` a complete build with `params`: `build(tmp)` writes every file into the empty
    directory `tmp`, the marker {"build": params, ...} last. -> whether this call built it (False: a
    complete build was there, or another process made it while this one waited for the lock)."""
    if not force and is_complete(path, marker, params):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_complete(path, marker, params):
            return False
        _build_into(path, build)
        return True
    finally:
        os.close(lock)  # releases the lock


def _build_into(path: Path, build: Callable[[Path], object]) -> None:
    """Build into a temporary sibling of `path`, then swap it into place (the old one deleted after)."""
    remove_stale(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        build(tmp)
        if path.exists():  # an outdated or unfinished build: swap, then delete it
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
