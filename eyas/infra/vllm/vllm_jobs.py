"""Run vllm_offline.py under vLLM's own Python: one target, several speculative configurations,
the same prompts, one process (see vllm_offline.py for the job and result layout)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from eyas.infra.errors import RunError

from .vllm_env import default_eager, require_vllm, vllm_environ

SCRIPT = Path(__file__).with_name("vllm_offline.py")
# the capture worker (data/capture_vllm.py starts it): a script vLLM's own Python runs, beside this module
CAPTURE_WORKER = Path(__file__).with_name("vllm_capture_worker.py")


def run_offline(
    target: str | Path,
    runs: list[dict],
    prompts: list[list[int]],
    sampling: dict,
    dtype: str = "float32",
    max_model_len: int | None = None,
    log_path: str | Path | None = None,
    timeout_s: float = 1800,
    eager: bool | None = None,
    per_request: bool = False,
    max_num_seqs: int | None = None,
) -> dict[str, dict]:
    """`runs`: [{"name", "speculative_config": dict or None}]. -> {name: result} (vllm_offline.py),
    a refused configuration as {"error": vLLM's message}. `eager` (None: on a CPU only): --enforce-eager.
    `per_request`: the prompts one at a time, each result with its prompts' own counters; `max_num_seqs`:
    at most that many in flight (None: vLLM's default)."""
    python = require_vllm("running vLLM offline")
    job = {
        "target": str(target),
        "dtype": dtype,
        "enforce_eager": default_eager() if eager is None else eager,
        "max_model_len": max_model_len,
        "prompts": prompts,
        "sampling": sampling,
        "runs": runs,
        "per_request": per_request,
        "max_num_seqs": max_num_seqs,
    }
    with tempfile.TemporaryDirectory(prefix="eyas-vllm-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.jsonl"
        job_path.write_text(json.dumps(job))
        log = Path(log_path) if log_path else Path(tmp) / "vllm.log"
        env = vllm_environ()
        with open(log, "wb") as f:
            proc = subprocess.run(
                [python, str(SCRIPT), str(job_path), str(out_path)],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout_s,
            )
        results = (
            [json.loads(line) for line in out_path.read_text().splitlines()] if out_path.exists() else []
        )
        if proc.returncode != 0 or len(results) != len(runs):
            tail = log.read_text(errors="replace")[-3000:]
            raise RunError(f"vLLM offline job on {target} failed (exit {proc.returncode}):\n{tail}")
    return {r["name"]: r for r in results}
