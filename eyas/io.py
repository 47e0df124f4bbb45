"""Files that are either complete or absent: atomic writes and stage markers.

A stage writes its outputs under `RUN/<stage>/`, each file via a temporary name in the same
directory and `os.replace`, and writes `RUN/<stage>/DONE.json` last. A re-run skips a stage
whose marker exists, and a crashed stage leaves only files it can resume from (never a
half-written one under its final name).
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


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
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


def read_jsonl(path: str | Path) -> list[dict]:
    """Each line a JSON object; a bad line fails with the file and line number."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
            rows.append(obj)
    return rows


def stage_dir(run_dir: str | Path, stage: str) -> Path:
    d = Path(run_dir) / stage
    d.mkdir(parents=True, exist_ok=True)
    return d


def marker(run_dir: str | Path, stage: str) -> Path:
    return Path(run_dir) / stage / "DONE.json"


def is_done(run_dir: str | Path, stage: str) -> bool:
    return marker(run_dir, stage).is_file()


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def read_done(run_dir: str | Path, stage: str) -> dict:
    return read_json(marker(run_dir, stage))


def mark_done(run_dir: str | Path, stage: str, info: dict) -> None:
    write_json(marker(run_dir, stage), info)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory next to `path`; on success it replaces `path` (an existing
    directory there is swapped out and removed only after the new one is in place)."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def require_done(run_dir: str | Path, needed: str, stage: str) -> None:
    """Fail clearly when `stage` is run before the stage it reads from."""
    if not is_done(run_dir, needed):
        raise RuntimeError(f"{run_dir}: the {needed} stage has not finished; run it before {stage} "
                           f"(`eyas {needed} {run_dir}`, or `eyas run` for every stage)")
