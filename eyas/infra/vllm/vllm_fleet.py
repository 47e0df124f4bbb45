"""vLLM over a machine's devices: replicas of the target, each over `vllm.tensor_parallel_size` devices,
for regeneration (`data.backend: vllm`: one OpenAI server per replica) and capture (`capture.backend:
vllm`: one hidden-states worker per replica).

    devices 0..7, tensor_parallel_size 2      replica 0: GPUs 0,1   replica 1: GPUs 2,3   ...  (4 replicas)
    a CPU machine, devices [0, 1], replicas 2  replica 0: core 0     replica 1: core 1

Why one engine per replica and not vLLM's own data parallelism (`--data-parallel-size`): for an MoE target
such as gpt-oss, vLLM's data-parallel ranks are not independent. vllm/v1/engine/core.py runs them as
`DPEngineCoreProc` (dense models get independent `EngineCoreProc`s), whose ranks step in lockstep: an idle
rank runs dummy batches while any rank has work, the ranks all-reduce their state every few steps, and the
expert layers form one (DP x TP) group. For regeneration and capture, where a replica of the whole target
fits its GPU group (gpt-oss-120b in MXFP4 on one 80 GB H100), separate engines do the same work with no
traffic between GPUs and no rank waiting on another; eyas spreads the prompts over them itself
(data/server.py: one queue, `data.server_concurrency` requests in flight per replica).

A replica sees only its devices: CUDA_VISIBLE_DEVICES on a GPU machine; on a CPU machine vLLM's
VLLM_CPU_OMP_THREADS_BIND (its cores, one list per tensor-parallel rank), when devices or replicas are set.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eyas.infra.errors import InputError, RunError

from .vllm_server import START_TIMEOUT_S, VllmServer

if TYPE_CHECKING:  # annotations only: the recipe's `vllm` section sits a layer above (docs/architecture.md)
    from eyas.recipes.schema import VllmSection


@dataclass(frozen=True)
class Replica:
    """One engine's place: its devices (GPU ids as nvidia-smi numbers them, or CPU core ids)."""

    index: int
    devices: tuple[str, ...]  # empty: vLLM places itself (a CPU machine with no devices or replicas set)
    kind: str  # "cuda" | "cpu"
    tensor_parallel_size: int

    def env(self) -> dict[str, str]:
        """The variables that confine the engine to its devices."""
        if self.kind == "cuda":
            return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices)}
        if not self.devices:
            return {}
        per_rank = len(self.devices) // self.tensor_parallel_size
        ranks = [self.devices[r * per_rank : (r + 1) * per_rank] for r in range(self.tensor_parallel_size)]
        return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(r) for r in ranks)}

    def describe(self) -> str:
        where = {"cuda": "GPU", "cpu": "CPU core"}[self.kind]
        if not self.devices:
            return f"replica {self.index} on this machine's CPU cores"
        plural = "s" if len(self.devices) > 1 else ""
        return f"replica {self.index} on {where}{plural} {','.join(self.devices)}"


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as the ids a child's CUDA_VISIBLE_DEVICES takes (indices or UUIDs)."""
    import torch

    n = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()][:n]
    return [str(i) for i in range(n)]


def replicas(v: VllmSection) -> list[Replica]:
    """The recipe's `vllm` section placed on this machine: GPUs where torch sees any, else CPU cores."""
    tp = v.tensor_parallel_size
    gpus = visible_gpus()
    kind = "cuda" if gpus else "cpu"
    if v.devices is not None:
        devices = [str(d) for d in v.devices]
    elif gpus:
        devices = gpus
    elif v.replicas is None and tp == 1:  # a CPU machine, nothing set: one engine, vLLM's own binding
        return [Replica(0, (), "cpu", 1)]
    else:
        devices = [str(c) for c in sorted(os.sched_getaffinity(0))]
    n = v.replicas if v.replicas is not None else (len(devices) // tp if kind == "cuda" else 1)
    if n < 1 or n * tp > len(devices):
        where = "GPUs" if kind == "cuda" else "CPU cores"
        raise InputError(
            f"vllm.replicas / vllm.tensor_parallel_size: {max(n, 1)} replica(s) x {tp} devices do not fit "
            f"the {len(devices)} {where} vLLM may use ({','.join(devices) or 'none'}; vllm.devices)"
        )
    per = len(devices) // n if kind == "cpu" else tp  # a CPU replica takes its share of the cores
    return [Replica(i, tuple(devices[i * per : (i + 1) * per]), kind, tp) for i in range(n)]


def describe_fleet(where: list[Replica]) -> str:
    return f"vLLM: {len(where)} replica(s): " + "; ".join(r.describe() for r in where)


def eager(v: VllmSection, kind: str) -> bool:
    """Whether the replicas run eagerly (--enforce-eager): vllm.enforce_eager where set, else on a CPU.
    On a GPU vLLM captures CUDA graphs of its decode steps by default, which regeneration's decode speed
    rests on; on a CPU its build would compile the forward with inductor at every start instead (vLLM 0.32's
    vllm/platforms/cpu.py), and eyas's CPU checks compare against an eager forward."""
    return v.enforce_eager if v.enforce_eager is not None else kind != "cuda"


def engine_args(v: VllmSection, kind: str, max_model_len: int | None) -> list[str]:
    """The `vllm serve` arguments of every replica (the capture worker parses the same ones)."""
    args = ["--tensor-parallel-size", str(v.tensor_parallel_size)]
    args += ["--enforce-eager"] if eager(v, kind) else []
    if kind == "cuda":
        args += ["--gpu-memory-utilization", str(v.gpu_memory_utilization)]
    if v.max_model_len or max_model_len:
        args += ["--max-model-len", str(v.max_model_len or max_model_len)]
    if v.max_num_seqs:
        args += ["--max-num-seqs", str(v.max_num_seqs)]
    return args + list(v.extra_args)


class VllmFleet:
    """An OpenAI server per replica, started together, checked while they serve, stopped together.

    with VllmFleet(target, replicas(recipe.vllm), args, dtype, log_dir) as fleet:
        fleet.urls          # one per replica
        fleet.check()       # raises ReplicaDied naming the replica and its log if one has exited
    """

    def __init__(self, target: str, where: list[Replica], args: list[str], dtype: str, log_dir: Path):
        self.where = where
        self.servers = [
            VllmServer(
                target,
                dtype=dtype,
                eager=False,  # `args` carry --enforce-eager where the recipe runs eagerly (engine_args)
                extra_args=tuple(args),
                log_path=Path(log_dir)
                / ("vllm-server.log" if len(where) == 1 else f"vllm-server-{r.index}.log"),
                env=r.env(),
            )
            for r in where
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> VllmFleet:
        """Every replica launched at once, then each waited for (its /health); one refusal stops them all."""
        print(describe_fleet(self.where), flush=True)
        deadline = time.monotonic() + timeout_s
        try:
            for s in self.servers:
                s.launch()
            for r, s in zip(self.where, self.servers):
                s.wait_ready(deadline, who=r.describe())
        except BaseException:
            self.stop()
            raise
        return self

    def check(self) -> None:
        """Raises ReplicaDied for the first replica whose server has exited."""
        for r, s in zip(self.where, self.servers):
            if not s.alive():
                raise ReplicaDied(
                    f"vLLM {r.describe()} exited (exit {s.proc.returncode}) while serving: "
                    f"{s.last_error()} (log: {s.log_path}); re-run the stage to resume"
                )

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> VllmFleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ReplicaDied(RunError):
    """A vLLM replica exited while eyas was using it; the message names it and its log."""
