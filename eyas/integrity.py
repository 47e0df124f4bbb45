"""Integrity of a run: every file a stage writes, with its size and xxh3-64 checksum, and `eyas verify`.

A stage's `DONE.json` lists its files under "files" ({path from the run dir: {"size", "xxh3_64"}}):
everything under RUN/<stage>/ (hidden temporary files aside) and what it wrote outside it (eval's
report.json, report.md and plots). The capture's shards get theirs when each is written (while it is
still in the page cache) and carry them in capture/index.json, so a partial capture is checked too and
the stage's end does not read terabytes again.

    eyas verify RUN        every listed file: present, its size, its checksum; names each bad file
                           and the stage to redo; exit 1 when any is bad
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from eyas.errors import CorruptData

ALGO = "xxh3_64"
TRACKER_DIRS = ("wandb", "tensorboard", "trackio")
CHUNK = 16 << 20


def file_record(path: str | Path) -> dict:
    """{"size": bytes, "xxh3_64": hex digest} of a file, read in 16 MiB chunks."""
    import xxhash

    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return {"size": os.path.getsize(path), ALGO: h.hexdigest()}


def stage_files(run_dir: str | Path, stage: str, outside: tuple[str | Path, ...] = (),
                known: dict[str, dict] | None = None) -> dict[str, dict]:
    """The records of a finished stage's files: RUN/<stage>/** (not DONE.json, not hidden files or links)
    and `outside` (paths the stage wrote elsewhere in the run). `known` ({path from the run dir: record},
    checksums taken when the files were written) is used where the size still agrees."""
    run_dir = Path(run_dir)
    paths = []
    for root, dirs, files in os.walk(run_dir / stage):
        # trackers' folders are theirs (wandb's service may append to its logs after the run ends)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in TRACKER_DIRS)
        paths += [Path(root) / f for f in sorted(files) if not f.startswith(".")]
    paths = [p for p in paths if p.name != "DONE.json" or p.parent != run_dir / stage]
    paths += [run_dir / p for p in outside]
    records = {}
    for p in paths:
        if p.is_symlink() or not p.is_file():
            continue
        rel = p.relative_to(run_dir).as_posix()
        rec = (known or {}).get(rel, {})
        ok = ALGO in rec and rec.get("size") == p.stat().st_size
        records[rel] = {"size": rec["size"], ALGO: rec[ALGO]} if ok else file_record(p)
    return records


def check_file(path: Path, record: dict, full: bool = True) -> str | None:
    """What is wrong with `path` against its record (None: nothing); `full=False` checks the size only."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != record["size"]:
        return f"{size} bytes, {record['size']} when written ({'truncated' if size < record['size'] else 'grown'})"
    if full and ALGO in record and file_record(path)[ALGO] != record[ALGO]:
        return "checksum differs: its bytes changed since they were written"
    return None


def open_shard(path: Path, record: dict):
    """safe_open of a capture shard about to be read, checked first: its size against the index, then (in the
    opening itself) a safetensors header that covers exactly the file. -> the open shard, or CorruptData
    naming the file and the fix."""
    from safetensors import SafetensorError, safe_open

    problem = check_file(path, record, full=False) if "size" in record else (None if path.is_file() else "missing")
    if problem is None:
        try:
            return safe_open(path, "pt")
        except SafetensorError as e:
            problem = f"not a readable safetensors file ({e})"
    raise CorruptData(f"{path}: {problem}; run `eyas verify {path.parent.parent}` to list every bad file, then "
                      f"{redo_hint(path.parent.parent, 'capture')}")


def redo_hint(run_dir: Path, stage: str) -> str:
    return f"redo the {stage} stage: remove {run_dir / stage} and run `eyas {stage} {run_dir}`"


def run_records(run_dir: Path) -> list[tuple[str, str, dict]]:
    """(stage, path from the run dir, record) of every file the run lists: finished stages' DONE.json, and
    the shards of a capture in progress (their index). A stage finished before eyas kept checksums is
    skipped, with a note."""
    from eyas import io
    from eyas.pipeline import STAGE_ORDER

    out = []
    for stage in STAGE_ORDER:
        if io.is_done(run_dir, stage):
            files = json_of(io.marker(run_dir, stage), stage).get("files")
            if files is None:  # a stage finished by an eyas older than the checksums
                print(f"{io.marker(run_dir, stage)}: lists no files (made before eyas kept checksums): "
                      f"the {stage} stage is not checked")
                continue
            out += [(stage, rel, rec) for rel, rec in files.items()]
        elif stage == "capture":
            for index in sorted((run_dir / stage).glob("index*.json")):
                for s in json_of(index, stage).get("shards", []):
                    if "size" in s:
                        out.append((stage, f"{stage}/{s['file']}", s))
    return out


def json_of(path: Path, stage: str) -> dict:
    """A marker or index: a file that does not parse is damaged (named, with the stage to redo)."""
    import json

    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptData(f"{path}: not valid JSON ({e}): {redo_hint(path.parent.parent, stage)}") from None


def verify_run(run_dir: str | Path, progress: bool = True) -> tuple[int, list[tuple[str, str, str]]]:
    """-> (files checked, [(stage, path, problem)])."""
    from tqdm.auto import tqdm

    run_dir = Path(run_dir)
    records = run_records(run_dir)
    bad = []
    for stage, rel, rec in tqdm(records, desc="verify", unit="file", disable=not progress):
        problem = check_file(run_dir / rel, rec)
        if problem:
            bad.append((stage, rel, problem))
    return len(records), bad


def main_verify(argv: list[str] | None = None) -> int:
    """`eyas verify RUN`."""
    from eyas.errors import InputError
    from eyas.pipeline import STAGE_ORDER

    p = argparse.ArgumentParser(prog="eyas verify", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="run directory")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    run_dir = Path(args.run)
    if not (run_dir / "recipe.yaml").is_file():
        raise InputError(f"{run_dir}: not a run directory (no recipe.yaml); give the --out directory of a run")
    checked, bad = verify_run(run_dir, progress=not args.no_progress)
    for stage, rel, problem in bad:
        print(f"{run_dir / rel}: {problem}: {redo_hint(run_dir, stage)}")
    if bad:
        stages = [s for s in STAGE_ORDER if any(stage == s for stage, _, _ in bad)]
        raise CorruptData(f"{run_dir}: {len(bad)} of {checked} files failed the check (listed above); redo the "
                          f"{', '.join(stages)} stage{'s' if len(stages) > 1 else ''}")
    print(f"{run_dir}: {checked} files checked, all intact")
    return 0
