"""One row over P processes (train.sequence_parallel, train/sequence_parallel.py): per-process peak memory and
step time against the row length T, for P = 1, 2, 4, on CPU processes (gloo) or GPUs (nccl).

    python benchmarks/bench_sequence_parallel.py --size gpt-oss-attention --ps 1 2 4 --lengths 16384 32768 \
        --memory-cap-gb 16

Each (P, T) runs in fresh processes under torchrun: one TTT training step (forward, backward, the gradients
averaged over the P processes as DDP does, AdamW) of a random draft of --size (bench_ttt_step.py's SIZES) on
one random row of T tokens, fp32 on CPU (bf16 autocast on CUDA). Memory per process: CPU, the process's own
high-water resident set (VmHWM: exec starts it afresh, unlike getrusage, which carries over the launcher's);
CUDA, torch.cuda.max_memory_allocated; the largest over the P processes. "above T0" is that less the same P's
peak at --base-length (the draft, its gradients and AdamW state, the interpreter). "saved for backward" counts
the storages autograd keeps from the forward (torch.autograd.graph.saved_tensors_hooks; the weights among
them), exact where the resident set also holds what the allocator has freed but kept: the activations, which
should fall about 1/P ("x P" should stay level). The last lines name the longest measured T each P trains
within --memory-cap-gb.

--kind dflash (train/kinds/dflash; bench_ttt_step.py's DFlash layers, a block of --ttt-steps + 1, D-PACE):
--anchors random blocks a row, drawn where the loss mask is on; --answer-share F puts the loss mask on the
row's last F only (a long prompt, then its answer), so the blocks fall in the last shards. Each rank gathers
the row's context and runs its shard's blocks (train/sequence_parallel.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="gpt-oss-attention")
    p.add_argument("--ps", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    p.add_argument("--base-length", type=int, default=256)
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--attention", default="auto")
    p.add_argument("--checkpoint-layer", action="store_true")
    p.add_argument("--memory-cap-gb", type=float, default=16.0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kind", choices=["eagle3", "dflash"], default="eagle3")
    p.add_argument("--anchors", type=int, default=512, help="DFlash: blocks a row")
    p.add_argument("--answer-share", type=float, default=1.0, help="the loss mask on the row's last share")
    p.add_argument("--worker", metavar="OUT", help="(internal) run one step as a torchrun worker")
    p.add_argument("--length", type=int, help="(internal) the worker's T")
    return p.parse_args()


def own_peak_bytes(dev: torch.device) -> int:
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(args: argparse.Namespace) -> None:
    """One training step of this process's shard of the row; rank 0 writes {peak bytes per rank, seconds}."""
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    from bench_ttt_step import make_draft, step_inputs

    from eyas.train.kinds import KINDS
    from eyas.train.sequence_parallel import SequenceParallel
    from eyas.train.ttt import TTTModule

    dev = torch.device(args.device if args.device == "cpu" else f"cuda:{os.environ.get('LOCAL_RANK', 0)}")
    dist.init_process_group("gloo" if dev.type == "cpu" else "nccl")
    P = dist.get_world_size()
    kind = KINDS[args.kind]
    sp = SequenceParallel.build(P, args.ttt_steps, dev.type, kind.sp_splits_heads) if P > 1 else None
    draft, lm_head = make_draft(args.size, dev.type == "cuda", args.kind, args.ttt_steps)
    options = {"anchors": args.anchors, "anchor_seed": (0, 0), "dpace": 0.5} if args.kind == "dflash" else {}
    module = TTTModule(
        draft, lm_head, args.ttt_steps, 0.8, args.attention, args.checkpoint_layer, sp=sp,
        unroll=kind.forward, options=options, rows=kind.rows,
    ).to(dev)  # fmt: skip
    params = [q for q in module.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    V, H = lm_head.shape
    n_aux = len(draft.config.aux_layer_ids)
    (aux, x, mask, doc), final = step_inputs(1, args.length, H, V, torch.device("cpu"), n_aux)
    mask[:, : int(args.length * (1 - args.answer_share))] = 0  # the prompt
    batch = {"aux": aux, "input_ids": x, "loss_mask": mask, "doc_ids": doc, "final": final}
    batch = {k: v.to(dev) for k, v in (sp.window(batch) if sp else batch).items()}
    autocast = (
        torch.autocast(dev.type, dtype=torch.bfloat16)
        if dev.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    dist.barrier()
    t0 = time.perf_counter()
    saved: dict[int, int] = {}  # the tensors autograd keeps for backward (the activations), by storage

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with autocast, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = module(**batch)
    out.loss.backward()
    for q in params:  # as DDP: the average over the processes (each loss was scaled by P)
        dist.all_reduce(q.grad)
        q.grad /= P
    opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peaks, kept = [None] * P, [None] * P
    dist.all_gather_object(peaks, own_peak_bytes(dev))
    dist.all_gather_object(kept, sum(saved.values()))
    if dist.get_rank() == 0:
        res = {"peaks": peaks, "saved": kept, "seconds": seconds, "loss": out.loss_value}
        Path(args.worker).write_text(json.dumps(res))
    dist.destroy_process_group()


def launch(args: argparse.Namespace, P: int, T: int) -> dict | None:
    """torchrun with P processes for length T -> the worker's result (None: it failed, e.g. out of memory)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(f"/tmp/bench-sp-{os.getpid()}.json")
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={P}", "--master_addr=127.0.0.1",
        f"--master_port={port}", __file__, "--worker", str(out), "--length", str(T), "--size", args.size,
        "--ttt-steps", str(args.ttt_steps), "--attention", args.attention, "--device", args.device,
        "--kind", args.kind, "--anchors", str(args.anchors), "--answer-share", str(args.answer_share),
        *(["--checkpoint-layer"] if args.checkpoint_layer else []),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // P))}
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode or not out.is_file():
        print(
            f"P={P} T={T}: failed (exit status {r.returncode}): {r.stderr.strip().splitlines()[-1:]}",
            flush=True,
        )
        return None
    res = json.loads(out.read_text())
    out.unlink()
    return res


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    print(f"size={args.size} kind={args.kind} ttt_steps={args.ttt_steps} device={args.device} "
          f"attention={args.attention} checkpoint_layer={args.checkpoint_layer} cpus={os.cpu_count()}"
          + (f" anchors={args.anchors} answer_share={args.answer_share}" if args.kind == "dflash" else ""),
          flush=True)  # fmt: skip
    print(
        "| P | T | s/step | peak GB per process | above T0 GB | saved for backward GB per process | x P |",
        "|---|---|---|---|---|---|---|",
        sep="\n",
    )
    longest = {}
    for P in args.ps:
        base = launch(args, P, args.base_length)
        t0 = max(base["peaks"]) if base else 0
        for T in args.lengths:
            res = launch(args, P, T)
            if res is None:
                continue
            peak = max(res["peaks"])
            above, kept = (peak - t0) / 1e9, max(res["saved"]) / 1e9
            cells = [f"{T:,}", f"{res['seconds']:.1f}", f"{peak / 1e9:.2f}", f"{above:.2f}", f"{kept:.2f}"]
            print(f"| {P} | {' | '.join(cells)} | {kept * P:.2f} |", flush=True)
            if peak <= args.memory_cap_gb * 1e9:
                longest[P] = max(longest.get(P, 0), T)
    for P in args.ps:
        cap = f"{args.memory_cap_gb:g} GB"
        print(f"P={P}: the longest measured T within {cap} per process: {longest.get(P, 'none')}")


if __name__ == "__main__":
    main()
