"""Files that are either complete or absent: atomic writes, and JSON / JSON-lines reading.

A stage writes each output file via a temporary name in the same directory and `os.replace`, so a
crashed stage leaves only files it can resume from (never a half-written one under its final name);
its DONE.json marker is written last (eyas/infra/layout.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eyas.infra.errors import BadInputFile, CorruptData, causes
from eyas.infra.errors import disk_full as says_disk_full


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it is renamed to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        full = disk_full(e, path.parent, path)  # (asked before the partial file goes and frees its space)
        if os.path.exists(tmp):
            os.unlink(tmp)
        if full:  # name the file, not the temporary
            raise full from e
        raise


DISK_FULL_WORDS = (
    "no space left on device",
    "os error 28",
    "storagefull",
    "disk quota exceeded",
    "os error 122",
)


def disk_full(e: BaseException, directory: str | Path, path: str | Path | None = None) -> OSError | None:
    """OSError(ENOSPC, ..., `path`) when `e` came from a full disk, else None. The libraries that write our
    big files say so in their own ways: safetensors raises SafetensorError("... Os { code: 28, kind:
    StorageFull ...}"), torch.save a RuntimeError("... file write failed"); so the errno or the words are
    looked for in `e` and its causes, and `directory`'s free space (below 1 MiB) decides the rest."""

    if not isinstance(e, Exception):
        return None
    path = str(path or directory)
    for c in causes(e):
        if says_disk_full(c):
            return OSError(c.errno, os.strerror(c.errno), path)
        if any(w in str(c).lower() for w in DISK_FULL_WORDS):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return (
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        if st.f_bavail * st.f_frsize < 1 << 20
        else None
    )


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_jsonl(path: str | Path, rows) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


def read_jsonl(path: str | Path, user_file: bool = False) -> list[dict]:
    """Each line a JSON object; a bad line fails with the file and line number: bad input (a file the user
    gave, `user_file`) or a damaged run file (CorruptData: a stage wrote it whole)."""

    def bad(what: str) -> Exception:
        if user_file:
            return BadInputFile(f"{path}:{n}: {what}; fix that line")
        return CorruptData(
            f"{path}:{n}: {what}, in a file eyas wrote whole: it is damaged; `eyas verify` on the "
            "run names the stage to redo"
        )

    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise bad(f"not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise bad(f"expected a JSON object, got {type(obj).__name__}")
            rows.append(obj)
    return rows


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def previous_dir(path: str | Path) -> Path:
    """Where `atomic_dir` keeps the directory it replaces until the new one is in place."""
    path = Path(path)
    return path.with_name(f".{path.name}.old")


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory next to `path`; on success it replaces `path` (an existing
    directory there is swapped out and removed only after the new one is in place)."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = previous_dir(path)
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException as e:
        full = disk_full(e, path.parent, path)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise full from e
        raise
