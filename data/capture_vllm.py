"""`capture.backend: vllm`: the aux and final hidden states from vLLM's own forward of the target.

    eyas (this module)                                 vLLM's Python (serve/external/)
    VllmCapture.start()  -- spawns, listens -->        vllm_capture_worker.py: LLM(extract_hidden_states,
    capture(sequences)   -- token ids ------->           CpuHiddenStatesConnector) prefills each sequence
                         <-- files ----------            one safetensors per sequence: (T, n_ids, H)
    rows(...)            aux = the aux ids' states, final = the target's own final norm applied to
                         id N (the last layer's output), exactly what the HF path stores

Everything else is the HF path's (data/capture.py): the length order, the batches, the shards and
index, resuming after the last listed shard, `--shard I/N`. vLLM returns no logits here, so the
HF path's first-batch check (lm_head(final) == the target's logits) is not run: the final state
is the target's final norm of vLLM's last-layer output, which tests/test_vllm_capture.py holds
equal to the HF capture. If the worker dies, the stage stops naming its log; a re-run resumes.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path

import torch
from safetensors.torch import load_file

from eyas.errors import InputError, RunError
from eyas.serve.external.vllm_env import require_vllm
from eyas.serve.external.vllm_server import last_error

WORKER = Path(__file__).resolve().parents[1] / "serve" / "external" / "vllm_capture_worker.py"
START_TIMEOUT_S = 900


class VllmCaptureError(RunError):
    """The vLLM capture worker refused the target or died; the message quotes vLLM."""


class VllmCapture:
    """A vLLM worker process that returns the hidden states of `layer_ids` (vLLM ids) per sequence."""

    def __init__(self, target: str, layer_ids: list[int], dtype: str, log_path: Path):
        self.target, self.layer_ids, self.dtype, self.log_path = target, layer_ids, dtype, Path(log_path)
        self.tmp = tempfile.TemporaryDirectory(prefix="eyas-vllm-capture-")
        self.proc: subprocess.Popen | None = None
        self.conn = None

    def start(self) -> VllmCapture:
        python = require_vllm("capture.backend: vllm")
        address, key = os.path.join(self.tmp.name, "sock"), secrets.token_bytes(16)
        job = {
            "target": self.target,
            "dtype": self.dtype,
            "layer_ids": self.layer_ids,
            "storage": os.path.join(self.tmp.name, "states"),
            "address": address,
            "authkey": key.hex(),
            "max_model_len": None,
        }
        job_path = Path(self.tmp.name) / "job.json"
        job_path.write_text(json.dumps(job))
        listener = Listener(address, authkey=key)
        accepted: list = []
        threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [python, str(WORKER), str(job_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not accepted:
            self._alive_or_raise("starting")
            if time.monotonic() > deadline:
                raise VllmCaptureError(
                    f"vLLM did not start within {START_TIMEOUT_S} s (log: {self.log_path})"
                )
            time.sleep(0.2)
        self.conn = accepted[0]
        self._reply("loading the target")
        return self

    def _alive_or_raise(self, doing: str) -> None:
        if self.proc.poll() is not None:
            msg = last_error(self.log_path.read_text(errors="replace"))
            raise VllmCaptureError(
                f"capture.backend: vllm: the vLLM worker exited while {doing} {self.target} "
                f"(exit {self.proc.returncode}): {msg} (log: {self.log_path}); re-run the stage to resume"
            )

    def _reply(self, doing: str) -> dict:
        while not self.conn.poll(0.2):
            self._alive_or_raise(doing)
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):  # the worker's end closed: it died
            self.proc.wait(30)
            self._alive_or_raise(doing)
            raise
        if "error" in msg:
            raise (InputError if doing == "loading the target" else VllmCaptureError)(
                f"capture.backend: vllm: vLLM refused {self.target}: {msg['error']} (log: {self.log_path})"
            )
        return msg

    def capture(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """-> per sequence its states (T, len(layer_ids), H), float32 as vLLM computed them."""
        self.conn.send({"sequences": sequences})
        out = []
        for f in self._reply("capturing")["files"]:
            out.append(load_file(f)["hidden_states"])
            for p in (f, f + ".lock"):
                Path(p).unlink(missing_ok=True)
        return out

    def close(self) -> None:
        if self.conn is not None and self.proc.poll() is None:
            try:
                self.conn.send({"close": True})
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.tmp.cleanup()

    def __enter__(self) -> VllmCapture:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def vllm_layer_ids(aux_ids: list[int], num_layers: int) -> tuple[list[int], list[int], int]:
    """The ids vLLM keeps, ascending: the aux ids and N (the last layer's output).
    -> (ids, where each aux id is among them, where N is)."""
    ids = sorted({*aux_ids, num_layers})
    return ids, [ids.index(k) for k in aux_ids], ids.index(num_layers)


def split_states(
    states: torch.Tensor, aux_at: list[int], final_at: int, norm
) -> tuple[torch.Tensor, torch.Tensor]:
    """states (T, n_ids, H) -> aux (1, T, n_aux*H) in the aux ids' order, final (1, T, H) = norm(id N)."""
    T = states.shape[0]
    aux = states[:, aux_at].reshape(1, T, -1)
    with torch.no_grad():
        final = norm(states[:, final_at].float())[None]
    return aux, final
