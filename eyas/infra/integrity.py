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
import json
from pathlib import Path

from tqdm.auto import tqdm

from eyas.infra.errors import CorruptData, InputError
from eyas.infra.layout import ALGO, RECIPE, file_record, is_done, marker
from eyas.infra.stages import STAGE_ORDER


def check_file(path: Path, record: dict, full: bool = True) -> str | None:
    """What is wrong with `path` against its record (None: nothing); `full=False` checks the size only."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != record["size"]:
        how = "truncated" if size < record["size"] else "grown"
        return f"{size} bytes, {record['size']} when written ({how})"
    if full and ALGO in record and file_record(path)[ALGO] != record[ALGO]:
        return "checksum differs: its bytes changed since they were written"
    return None


def open_shard(path: Path, record: dict):
    """safe_open of a capture shard about to be read, checked first: its size against the index, then (in the
    opening itself) a safetensors header that covers exactly the file. -> the open shard, or CorruptData
    naming the file and the fix."""
    from safetensors import SafetensorError, safe_open

    problem = (
        check_file(path, record, full=False) if "size" in record else (None if path.is_file() else "missing")
    )
    if problem is None:
        try:
            return safe_open(path, "pt")
        except SafetensorError as e:
            problem = f"not a readable safetensors file ({e})"
    raise CorruptData(
        f"{path}: {problem}; run `eyas verify {path.parent.parent}` to list every bad file, then "
        f"{redo_hint(path.parent.parent, 'capture')}"
    )


def redo_hint(run_dir: Path, stage: str) -> str:
    return f"redo the {stage} stage: remove {run_dir / stage} and run `eyas {stage} {run_dir}`"


def run_records(run_dir: Path) -> list[tuple[str, str, dict]]:
    """(stage, path from the run dir, record) of every file the run lists: finished stages' DONE.json, and
    the shards of a capture in progress (their index). A stage finished before eyas kept checksums is
    skipped, with a note."""
    out = []
    for stage in STAGE_ORDER:
        if is_done(run_dir, stage):
            files = json_of(marker(run_dir, stage), stage).get("files")
            if files is None:  # a stage finished by an eyas older than the checksums
                print(
                    f"{marker(run_dir, stage)}: lists no files (made before eyas kept checksums): "
                    f"the {stage} stage is not checked"
                )
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

    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptData(f"{path}: not valid JSON ({e}): {redo_hint(path.parent.parent, stage)}") from None


def verify_run(run_dir: str | Path, progress: bool = True) -> tuple[int, list[tuple[str, str, str]]]:
    """-> (files checked, [(stage, path, problem)])."""

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

    p = argparse.ArgumentParser(
        prog="eyas verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run", help="run directory")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    run_dir = Path(args.run)
    if not (run_dir / RECIPE).is_file():
        raise InputError(
            f"{run_dir}: not a run directory (no recipe.yaml); give the --out directory of a run"
        )
    checked, bad = verify_run(run_dir, progress=not args.no_progress)
    for stage, rel, problem in bad:
        print(f"{run_dir / rel}: {problem}: {redo_hint(run_dir, stage)}")
    if bad:
        stages = [s for s in STAGE_ORDER if any(stage == s for stage, _, _ in bad)]
        raise CorruptData(
            f"{run_dir}: {len(bad)} of {checked} files failed the check (listed above); redo the "
            f"{', '.join(stages)} stage{'s' if len(stages) > 1 else ''}"
        )
    print(f"{run_dir}: {checked} files checked, all intact")
    return 0
