"""`capture.backend: vllm`: the aux and final hidden states from vLLM's own forward of the target.

    eyas (this module)                                 vLLM's Python (eyas/infra/vllm/)
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
import time
from multiprocessing.connection import Client
from pathlib import Path

import torch

from eyas.data.target import (
    context_length,
    load_final_norm,
    load_target_config,
    resolve_path,
    server_dtype,
    text_config,
)
from eyas.infra.errors import InputError, RunError
from eyas.infra.vllm.vllm_env import require_vllm, vllm_environ
from eyas.infra.vllm.vllm_fleet import describe_fleet, engine_args, replicas
from eyas.infra.vllm.vllm_jobs import CAPTURE_WORKER as WORKER
from eyas.infra.vllm.vllm_server import last_error

START_TIMEOUT_S = 900


class VllmCaptureError(RunError):
    """The vLLM capture worker refused the target or died; the message quotes vLLM."""


class VllmCapture:
    """A vLLM worker process that returns the hidden states of `layer_ids` (vLLM ids) per sequence; the
    process that starts it is its first client (start, submit / result, close). Other processes (online
    training's trainers) connect to a running worker with `connect`."""

    def __init__(
        self,
        target: str,
        layer_ids: list[int],
        dtype: str,
        log_path: Path,
        args: list[str] = (),
        env: dict[str, str] | None = None,
        who: str = "the vLLM worker",
        storage: str | None = None,
    ):
        self.target, self.layer_ids, self.dtype, self.log_path = target, layer_ids, dtype, Path(log_path)
        self.args, self.env, self.who = list(args), dict(env or {}), who  # vllm_fleet.engine_args, Replica
        self.tmp = tempfile.TemporaryDirectory(prefix="eyas-vllm-capture-")
        self.address, self.authkey = os.path.join(self.tmp.name, "sock"), secrets.token_bytes(16)
        self.storage = storage or os.path.join(self.tmp.name, "states")  # where the worker writes states
        self.proc: subprocess.Popen | None = None
        self.conn = None
        self._requests()

    @classmethod
    def connect(cls, info: dict) -> VllmCapture:
        """A client of a running worker described by `info()` of its owner (another process)."""
        self = cls.__new__(cls)
        self.target, self.log_path, self.who = info["target"], Path(info["log"]), info["who"]
        self.address, self.authkey = info["address"], bytes.fromhex(info["authkey"])
        self.proc, self.tmp = None, None
        self._requests()
        self.conn = Client(self.address, authkey=self.authkey)
        self._reply("connecting to")
        return self

    def _requests(self) -> None:
        self.asked = 0  # the next request's id
        self.open: list[int] = []  # sent, not yet returned or dropped, oldest first
        self.stash: dict[int, dict] = {}  # replies received before they were asked for
        self.dropped: set[int] = set()  # sent, and no longer wanted: their files are deleted on arrival

    def info(self) -> dict:
        """What another process needs to `connect` (online training's producers.json)."""
        keys = {"target": self.target, "log": str(self.log_path), "who": self.who, "address": self.address}
        return {**keys, "authkey": self.authkey.hex(), "storage": self.storage}

    def start(self) -> VllmCapture:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Start the worker (it listens, then loads the target); wait_ready() waits until it has."""
        python = require_vllm("capture.backend: vllm")
        job = {
            "target": self.target,
            "dtype": self.dtype,
            "layer_ids": self.layer_ids,
            "storage": self.storage,
            "address": self.address,
            "authkey": self.authkey.hex(),
            "engine_args": self.args,
            "parent_pid": os.getpid(),
        }
        job_path = Path(self.tmp.name) / "job.json"
        job_path.write_text(json.dumps(job))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [python, str(WORKER), str(job_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**vllm_environ(), **self.env},
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        """Connect as the worker's first client, then wait for it to load the target."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.conn is None:
            self._alive_or_raise("starting")
            if time.monotonic() > deadline:
                raise VllmCaptureError(
                    f"vLLM did not start within {START_TIMEOUT_S} s (log: {self.log_path})"
                )
            try:
                self.conn = Client(self.address, authkey=self.authkey)
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.2)
        self._reply("loading the target")

    def _alive_or_raise(self, doing: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            msg = last_error(self.log_path.read_text(errors="replace"))
            raise VllmCaptureError(
                f"capture.backend: vllm: {self.who} exited while {doing} {self.target} "
                f"(exit {self.proc.returncode}): {msg} (log: {self.log_path}); re-run the stage to resume"
            )

    def _reply(self, doing: str) -> dict:
        while not self.conn.poll(0.2):
            self._alive_or_raise(doing)
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):  # the worker's end closed: it died
            if self.proc is not None:
                self.proc.wait(30)
                self._alive_or_raise(doing)
            msg = last_error(self.log_path.read_text(errors="replace"))
            raise VllmCaptureError(
                f"capture.backend: vllm: {self.who} exited while {doing} {self.target}: {msg} "
                f"(log: {self.log_path})"
            ) from None
        if "error" in msg:
            raise (InputError if doing == "loading the target" else VllmCaptureError)(
                f"capture.backend: vllm: vLLM refused {self.target}: {msg['error']} (log: {self.log_path})"
            )
        return msg

    def capture(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """-> per sequence its states (T, len(layer_ids), H), float32 as vLLM computed them."""
        self.submit(sequences)
        return self.result()

    def submit(self, sequences: list[list[int]]) -> int:
        """Send a batch; -> its request id, for result() (the worker works on it meanwhile)."""
        rid = self.asked
        self.conn.send({"id": rid, "sequences": sequences})
        self.asked += 1
        self.open.append(rid)
        return rid

    def ready(self, rid: int) -> bool:
        """Whether request `rid`'s reply has arrived (result() would not wait for the worker)."""
        return rid in self.stash or self.conn.poll(0)

    def result(self, rid: int | None = None) -> list[torch.Tensor]:
        """The states of request `rid` (default: the oldest not returned), per sequence (T, n_ids, H), read
        through hs_connectors' file transport (it waits for the writer's lock), the files then deleted.
        Replies to other requests that arrive first are kept for their own result()."""
        rid = self.open[0] if rid is None else rid
        while rid not in self.stash:
            msg = self._reply("capturing")
            if msg["id"] in self.dropped:
                self.dropped.discard(msg["id"])
                _delete(msg["params"])
            else:
                self.stash[msg["id"]] = msg
        self.open.remove(rid)
        return [read_states(p) for p in self.stash.pop(rid)["params"]]

    def drop(self, rid: int) -> None:
        """Request `rid` is no longer wanted (a stream abandoned): its states are deleted, unread."""
        self.open.remove(rid)
        if rid in self.stash:
            _delete(self.stash.pop(rid)["params"])
        else:
            self.dropped.add(rid)

    def close(self) -> None:
        if self.conn is not None and (self.proc is None or self.proc.poll() is None):
            try:
                if self.proc is not None:
                    self.conn.send({"close": True})
                    self.proc.wait(60)
                self.conn.close()
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        if self.tmp is not None:
            self.tmp.cleanup()

    def __enter__(self) -> VllmCapture:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _delete(params: list[dict]) -> None:
    for p in params:
        for f in (p["hidden_states_path"], p["hidden_states_path"] + ".lock"):
            Path(f).unlink(missing_ok=True)


def read_states(params: dict) -> torch.Tensor:
    """One sequence's states (T, n_ids, H) from the worker's kv_transfer_params, through hs_connectors'
    file transport (`FileTransfer`: it waits on the writer's lock file); the file is deleted once read.
    Mooncake's transport (hs_connectors' MooncakeTransfer, RDMA across nodes) takes the same params."""
    from hs_connectors import FileTransfer

    transfer = FileTransfer(Path(params["hidden_states_path"]).parent)
    states = transfer.get_generated(params)
    transfer.delete(params["hidden_states_path"])
    return states["hidden_states"]


class CaptureReplicas:
    """A VllmCapture worker per replica (eyas/infra/vllm/vllm_fleet.py), started together, each kept busy
    with one batch while the batches come back in their order (so the shards are the single worker's).

    with CaptureReplicas(target, ids, dtype, replicas, args, log_dir) as workers:
        for j, states in workers.in_order(batches): ...     # states: per sequence (T, n_ids, H)
    """

    def __init__(
        self,
        target: str,
        layer_ids,
        dtype: str,
        where,
        args: list[str],
        log_dir: Path,
        label="",
        storage=None,
    ):
        stem = f"vllm{'-' + label if label else ''}"
        self.workers = [
            VllmCapture(
                target,
                layer_ids,
                dtype,
                Path(log_dir) / (f"{stem}.log" if len(where) == 1 else f"{stem}-{r.index}.log"),
                args,
                r.env(),
                who=f"the vLLM worker of {r.describe()}",
                storage=os.path.join(storage, str(r.index)) if storage else None,
            )
            for r in where
        ]
        self.where = where

    def __enter__(self) -> CaptureReplicas:
        print(describe_fleet(self.where), flush=True)
        try:
            for w in self.workers:
                w.launch()
            for w in self.workers:
                w.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def in_order(self, batches: list[list[list[int]]]):
        """-> (j, per sequence of batch j its states), j ascending; batch j goes to worker j % replicas."""
        n = len(self.workers)
        for j in range(min(n, len(batches))):
            self.workers[j].submit(batches[j])
        for j in range(len(batches)):
            states = self.workers[j % n].result()
            if j + n < len(batches):
                self.workers[j % n].submit(batches[j + n])
            yield j, states

    def close(self) -> None:
        for w in self.workers:
            w.close()

    def __exit__(self, *exc) -> None:
        self.close()


def vllm_layer_ids(aux_ids: list[int], num_layers: int) -> tuple[list[int], list[int], int]:
    """The ids vLLM keeps, ascending: the aux ids and N (the last layer's output).
    -> (ids, where each aux id is among them, where N is)."""
    ids = sorted({*aux_ids, num_layers})
    return ids, [ids.index(k) for k in aux_ids], ids.index(num_layers)


class StateSplit:
    """What vLLM returns per sequence, states (T, n_ids, H) of its ids (the aux ids and N, ascending), split
    into what eyas trains on: `split(states)` -> aux (1, T, n_aux*H) in the aux ids' order, final (1, T, H)
    = the target's own final norm of id N. `ids`: the ids to ask vLLM for."""

    def __init__(self, t, layer_ids: list[int]):
        cfg = text_config(load_target_config(t.model, t.trust_remote_code))
        self.ids, self.aux_at, self.final_at = vllm_layer_ids(layer_ids, cfg.num_hidden_layers)
        self.norm = load_final_norm(t.model, t.trust_remote_code)

    def __call__(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return split_states(states, self.aux_at, self.final_at, self.norm)


def replicas_for(recipe, ids: list[int], longest: int, log_dir: Path, label: str = "", storage=None):
    """A (not yet started) CaptureReplicas of the recipe's target over its `vllm` section, asking for the
    vLLM ids `ids`, its context long enough for `longest`-token sequences (and the one token asked)."""

    t, where = recipe.target, replicas(recipe.vllm)
    need = min(max(longest + 1, 16), context_length(t))
    args = engine_args(recipe.vllm, where[0].kind, need)
    return CaptureReplicas(
        resolve_path(t.model), ids, server_dtype(t.dtype), where, args, log_dir, label, storage
    )


def split_states(
    states: torch.Tensor, aux_at: list[int], final_at: int, norm
) -> tuple[torch.Tensor, torch.Tensor]:
    """states (T, n_ids, H) -> aux (1, T, n_aux*H) in the aux ids' order, final (1, T, H) = norm(id N)."""
    T = states.shape[0]
    aux = states[:, aux_at].reshape(1, T, -1)
    with torch.no_grad():
        final = norm(states[:, final_at].float())[None]
    return aux, final
