"""`capture.mode: online` with `capture.backend: vllm`: vLLM processes produce the target's hidden states
and the training processes consume them as they come, through a bounded buffer; nothing is stored.

    producers: vLLM on `vllm.devices`                       trainers: accelerate / torchrun, other devices
    vllm_capture_worker.py per replica  <-- token ids ---   VllmFeed.stream(micro-batches): asks for up
      (extract_hidden_states + the                            to `capture.online_prefetch` micro-batches
      hidden-states connector) prefills the                   ahead of the one training runs, round robin
      sequences of every trainer together  --- files -->      over the producers; reads each sequence's
      one safetensors per sequence, in shared memory          states (hs_connectors' FileTransfer), deletes
                                                              the file, puts aux and final where the packed
                                                              rows hold them, as an offline capture stores

The local main process starts the producers (train/producers.json says where they listen) and stops them
at the end; they exit by themselves when it dies. The order of the micro-batches is training's own
(train/schedule.py), so a resumed run asks for exactly the micro-batches the killed one had not trained
on: no sequence of the epoch is lost or repeated. A producer that stops ends training with one line naming
it and its log (train/trainer.py saves the state at the last finished step where it can).

Under sequence parallelism (train.sequence_parallel: P) the P processes of a group train on the same rows:
the group's first asks the producers for each micro-batch and broadcasts the states to the others, each of
which keeps its window (train/sequence_parallel.py), so the producers run every row once.

The buffer: each trainer holds at most `capture.online_prefetch` micro-batches asked for and not yet
trained on, as files in /dev/shm (RAM; the run's train/online-buffer where there is none). The transport
is hs_connectors' file backend: one node. Its Mooncake backend (RDMA, across nodes) reads the same
kv_transfer_params; wiring it in is the connector the producers load and the reader below.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from eyas.data.capture import DTYPES
from eyas.data.capture_vllm import CaptureReplicas, StateSplit, VllmCapture, VllmCaptureError, replicas_for
from eyas.data.target import refuse_vllm_mxfp4
from eyas.infra.errors import InputError, RunError
from eyas.infra.io import read_json, write_json
from eyas.infra.layout import stage_dir
from eyas.infra.vllm.vllm_fleet import replicas, visible_gpus
from eyas.infra.vllm.vllm_server import last_error
from eyas.recipes.schema import Recipe

from .online import row_segments
from .sequence_parallel import SequenceParallel

PRODUCERS = "producers.json"


class ProducerStopped(RunError):
    """A vLLM producer of online training stopped; the message names it and its log."""


@dataclass
class FeedStats:
    """What the feed delivered, on this process: micro-batches, how many were not ready when training asked
    for them (and the seconds it waited), tokens."""

    micro_batches: int = 0
    asked: int = 0  # micro-batches this process sent to the producers (under SP: its group's first only)
    waited: int = 0
    waited_s: float = 0.0
    tokens: int = 0


class VllmFeed:
    """This process's clients of the producers, and what turns their states into training batches."""

    def __init__(self, recipe: Recipe, index: dict, producers: list[dict], device: torch.device):
        self.split = StateSplit(recipe.target, index["aux_layer_ids"])
        self.dtype, self.device = DTYPES[recipe.capture.dtype], device
        self.depth = recipe.capture.online_prefetch
        self.clients = [VllmCapture.connect(p) for p in producers]
        self.turn = 0  # the producer the next micro-batch goes to
        self.stats = FeedStats()
        self.owner: CaptureReplicas | None = None  # the local main process's: it stops them
        self.buffer: str | None = None
        self.cores: set[int] | None = None  # this process's CPU cores before it left the producers theirs
        # train.sequence_parallel > 1: the group's processes train on the same rows; its first asks the
        # producers for the whole row and broadcasts the states to the others (each then keeps its window),
        # so the producers run each row once, not once per process of the group
        self.sp: SequenceParallel | None = None

    def stream(self, batches: Iterable[dict]) -> Iterator[dict]:
        """The collated micro-batches with "aux" and "final" added, on the device, in their order; up to
        `depth` of them asked for ahead of the one yielded. A stream left before its end (training stops
        at train.max_steps mid-epoch) drops what it had asked for, so another stream (validation) gets its
        own states."""
        pending: deque = deque()
        try:
            for batch in batches:
                pending.append(self._ask(batch))
                if len(pending) >= self.depth:
                    yield self._take(pending.popleft())
            while pending:
                yield self._take(pending.popleft())
        finally:
            for _, _, client, rid in pending:
                if client is not None:
                    client.drop(rid)

    def _ask(self, batch: dict) -> tuple:
        """Send a micro-batch's sequences (as the rows hold them, cut to the row) to the next producer."""
        segs = row_segments(batch["doc_ids"], batch["lengths"])
        if not segs or (self.sp is not None and self.sp.rank != 0):  # a filler, or the group's first asks
            return batch, segs, None, None
        client = self.clients[self.turn % len(self.clients)]
        self.turn += 1
        self.stats.asked += 1
        try:
            rid = client.submit([batch["input_ids"][b, s : s + n].tolist() for b, s, n in segs])
        except OSError:  # its end of the socket is closed
            raise self._stopped(client) from None
        return batch, segs, client, rid

    def _take(self, asked: tuple) -> dict:
        batch, segs, client, rid = asked
        states = []
        if client is not None:
            ready = client.ready(rid)
            t0 = time.perf_counter()
            try:
                states = client.result(rid)
            except VllmCaptureError:
                raise self._stopped(client) from None
            self.stats.waited += not ready
            self.stats.waited_s += (time.perf_counter() - t0) if not ready else 0.0
        self.stats.micro_batches += 1
        self.stats.tokens += int(batch["lengths"].sum())
        out = self.fill(batch, segs, states)
        if self.sp is not None and segs:
            for key in ("aux", "final"):
                dist.broadcast(out[key], group=self.sp.group, group_src=0)
        return out

    def fill(self, batch: dict, segs: list[tuple[int, int, int]], states: list[torch.Tensor]) -> dict:
        """aux (B, T, n_aux*H) and final (B, T, H) in capture.dtype, each sequence's (n, n_ids, H) states
        split as the offline vLLM capture splits them (final = the target's norm of id N)."""
        B, T = batch["input_ids"].shape
        H = self.split.norm.weight.shape[0]
        aux = torch.zeros(B, T, len(self.split.aux_at) * H, dtype=self.dtype)
        final = torch.zeros(B, T, H, dtype=self.dtype)
        for (b, s, n), x in zip(segs, states):
            a, f = self.split(x)  # (1, n, n_aux*H), (1, n, H)
            aux[b, s : s + n], final[b, s : s + n] = a[0].to(self.dtype), f[0].to(self.dtype)
        return {
            **{k: v.to(self.device) for k, v in batch.items()},
            "aux": aux.to(self.device),
            "final": final.to(self.device),
        }

    def _stopped(self, client: VllmCapture) -> ProducerStopped:
        """The one line naming a producer that stopped: which, how (its exit status where this process started
        it, else vLLM's last error line) and its log."""
        i = self.clients.index(client)
        proc = self.owner.workers[i].proc if self.owner is not None else None
        if proc is not None:
            _wait(proc)
        how = f"exit {proc.returncode}" if proc is not None and proc.returncode is not None else None
        how = how or last_error(client.log_path.read_text(errors="replace"))
        return ProducerStopped(
            f"online training: vLLM producer {i}, {client.who.removeprefix('the vLLM worker of ')}, stopped "
            f"({how}); its log: {client.log_path}"
        )

    def close(self) -> None:
        for c in self.clients:
            c.close()
        if self.owner is not None:
            self.owner.close()
        if self.buffer is not None:
            shutil.rmtree(self.buffer, ignore_errors=True)
        restore_cores(self.cores)


def restore_cores(cores: set[int] | None) -> None:
    """This process's CPU cores back to `cores` (None: nothing was changed)."""
    if cores is not None:
        os.sched_setaffinity(0, cores)


def _wait(proc) -> None:
    """Up to 10 s for a producer whose socket closed to exit (so its exit status can be said)."""
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def start_feed(recipe: Recipe, run_dir: Path, index: dict, lengths: list[int], acc) -> VllmFeed:
    """Every process: the local main process starts a producer per replica of the recipe's `vllm` section
    and writes train/producers.json; then every process connects to each of them."""

    out_dir = stage_dir(run_dir, "train")
    path = out_dir / PRODUCERS
    owner = buffer = None
    cores = _keep_apart(replicas(recipe.vllm), acc)
    if acc.is_local_main_process:
        path.unlink(missing_ok=True)
        owner, buffer = _start_producers(recipe, out_dir, index, lengths, acc)
        write_json(path, {"producers": [w.info() for w in owner.workers]})
    acc.wait_for_everyone()
    try:
        feed = VllmFeed(recipe, index, read_json(path)["producers"], acc.device)
    except BaseException:
        if owner is not None:
            owner.close()
        restore_cores(cores)
        raise
    feed.owner, feed.buffer, feed.cores = owner, buffer, cores
    return feed


def _start_producers(recipe: Recipe, out_dir: Path, index: dict, lengths: list[int], acc):
    """-> (the started CaptureReplicas, the buffer directory)."""

    refuse_vllm_mxfp4(recipe.target, "capture.backend")
    ids = StateSplit(recipe.target, index["aux_layer_ids"]).ids
    longest = min(max(lengths, default=1), recipe.train.max_length)  # rows cut sequences
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    buffer = tempfile.mkdtemp(prefix="eyas-online-", dir=shm or out_dir)
    owner = replicas_for(recipe, ids, longest, out_dir, "producer", storage=buffer)
    owner.__enter__()
    return owner, buffer


def _keep_apart(where, acc) -> set[int] | None:
    """Producers and trainers on separate devices: a trainer on a producer's GPU is an error naming
    vllm.devices; on a CPU machine the trainers leave the producers' cores to them -> the cores this process
    had before, where it gave some up (the feed's close gives them back: a process that goes on after
    training, such as a benchmark's or a test's, keeps its cores)."""
    producer_devices = {d for r in where for d in r.devices}
    if where[0].kind == "cpu":
        before = os.sched_getaffinity(0)
        mine = set(map(str, before)) - producer_devices
        if producer_devices and mine:
            os.sched_setaffinity(0, {int(c) for c in mine})
            return before
        return None

    gpus = visible_gpus()
    mine = gpus[acc.local_process_index] if acc.local_process_index < len(gpus) else None
    if mine in producer_devices:
        rest = [g for g in gpus if g not in producer_devices]
        raise InputError(
            f"vllm.devices: training process {acc.local_process_index} runs on GPU {mine}, which online "
            f"training gives to vLLM's producers ({','.join(sorted(producer_devices))}); set vllm.devices to "
            f"the producers' GPUs and launch the trainers on the others (CUDA_VISIBLE_DEVICES="
            f"{','.join(rest) or '...'})"
        )
    return None


def feed_stats(feed: VllmFeed | None) -> dict | None:
    return None if feed is None else {"producers": len(feed.clients), **asdict(feed.stats)}
