"""TTT training-step time and peak memory vs sequence length, for a draft of a given size.

    python benchmarks/bench_ttt_step.py                                   # demo-sized head, CPU
    python benchmarks/bench_ttt_step.py --size gpt-oss-attention --attention dense chunked sdpa \
        --lengths 1024 2048 4096 8192 16384 --repeat 1                    # linear vs quadratic, CPU
    python benchmarks/bench_ttt_step.py --size gpt-oss-120b --device cuda --lengths 4096 16384 32768
    python benchmarks/bench_ttt_step.py --kind peagle --ttt-steps 8 ...   # P-EAGLE: 8 depths, COD 0.7 / 0.2

Prints one line per (attention, length), in the anchors' format (../shared/bench):

    T=  4096     0.123 s/step      33301 tok/s  peak GPU     23456 MiB  (warm-up 41.2 s, loss 5.1234)

seconds per step (forward + backward + AdamW, median of --repeat after --warmup untimed steps,
where torch.compile happens), tokens/s and peak memory (CUDA: torch.cuda.max_memory_allocated;
CPU: the peak RSS of a fresh process per length, so allocator reuse across lengths cannot hide
growth). A length that runs out of memory prints OOM and the next one runs.
Precision: --precision bf16 autocasts like the trainer on GPUs (fp32 weights and AdamW, bf16
matmuls; the default on CUDA); fp32 is the default on CPU.
--kind peagle: a P-EAGLE draft (train/kinds/peagle) trained as the trainer trains it, --ttt-steps its depths,
COD sampling at --cod RATIO FLOOR (speculators' and the gpt-oss-120b-peagle recipe's 0.7 / 0.2).
--kind dflash --size gpt-oss-120b-dflash --ttt-steps 9: the DFlash recipe's draft (kind dflash; 8 layers,
blocks of 10 at 512 random anchors a row, D-PACE).
"""

import argparse
import resource
import statistics
import subprocess
import sys
import time
from contextlib import AbstractContextManager, nullcontext

import torch

from eyas.train import kinds, ttt
from eyas.train.kinds import KINDS
from eyas.train.kinds.config import DraftConfig
from eyas.train.model import Eagle3Draft
from eyas.train.packing import doc_ids_from_lengths
from eyas.train.ttt import TTTModule

SIZES = {
    # H, heads, kv heads, head_dim, intermediate, target vocab, draft vocab
    "demo": (128, 4, 2, 32, 512, 915, 256),  # recipes/demo.yaml on the built-in target
    "gpt-oss-120b": (2880, 64, 8, 64, 17280, 201088, 32000),
    "gpt-oss-20b": (2880, 64, 8, 64, 17280, 201088, 32000),  # the same draft dimensions as 120b
    # gpt-oss-120b's attention shape (64 heads of 64, 8 KV heads) with small H/MLP/vocab: what
    # the TTT attention costs at that head count, on a machine without a GPU
    "gpt-oss-attention": (512, 64, 8, 64, 1024, 4096, 1024),
    # recipes/gpt-oss-120b-dflash.yaml: z-lab's shape (MLP 7680, the whole vocabulary; 8 biased layers)
    "gpt-oss-120b-dflash": (2880, 64, 8, 64, 7680, 201088, 201088),
    # recipes/qwen2.5-coder-1.5b.yaml: the target's widths, its draft's MLP 4096 and 8K draft vocabulary
    "qwen2.5-coder-1.5b": (1536, 12, 2, 128, 4096, 151936, 8192),
}
# --kind dflash: z-lab's gpt-oss-120b DFlash draft (train/kinds/dflash), blocks of --ttt-steps + 1, 512 a row
DFLASH = {"num_layers": 8, "attention_bias": True, "aux_layer_ids": [2, 10, 18, 26, 34]}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def is_oom(e: BaseException) -> bool:
    return (
        isinstance(e, torch.OutOfMemoryError)
        or "out of memory" in str(e).lower()
        or "can't allocate memory" in str(e)
        or isinstance(e, MemoryError)
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--size", choices=SIZES, default="demo")
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument(
        "--attention", nargs="+", default=["auto"], choices=["auto", "flex", "chunked", "sdpa", "dense"]
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ttt-steps", type=int, default=7, help="TTT steps (--kind peagle: depths)")
    p.add_argument("--kind", choices=list(KINDS), default="eagle3", help="the draft kind (train/kinds/)")
    p.add_argument("--cod", type=float, nargs=2, default=[0.7, 0.2], metavar=("RATIO", "FLOOR"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps per length (default: 1 on CUDA, 0 on CPU)"
    )
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--checkpoint-layer", action="store_true", help="recompute each step's layer in backward")
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="torch.compile the draft's norms and MLP as train.compile does (auto: on CUDA)",
    )
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="CPU: cap each length's process (address space), so a quadratic path fails with OOM "
        "instead of swapping the machine",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timed steps, profile one more and print its N most expensive ops (self device time)",
    )
    p.add_argument("--one-process", action="store_true", help="(internal) run the lengths in this process")
    return p.parse_args()


def make_draft(
    size: str, compiled: bool, kind: str = "eagle3", steps: int = 7
) -> tuple[Eagle3Draft, torch.Tensor]:
    """A random draft of `size` (SIZES) and `kind` with a random draft vocabulary, and a random target lm_head
    (V, H). DFlash: DFLASH's layers and aux states, a block of `steps` + 1."""
    H, nh, nkv, hd, inter, V, Vd = SIZES[size]
    dflash = {**DFLASH, "block_size": steps + 1} if kind == "dflash" else {"aux_layer_ids": [2, 18, 33]}
    mask = {"mask_token_id": V - 1} if kind != "eagle3" else {}  # P-EAGLE's and DFlash's mask slots
    cfg = DraftConfig(
        hidden_size=H,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=hd,
        intermediate_size=inter,
        vocab_size=V,
        draft_vocab_size=Vd,
        kind=kind,
        **mask,
        **dflash,
    )
    torch.manual_seed(0)
    draft = kinds.make_draft(cfg)
    ids = torch.randperm(V)[:Vd].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    draft.set_vocab_map(ids - torch.arange(Vd), t2d)
    lm_head = torch.randn(V, H) * 0.02
    if compiled:
        draft.compile_math()
    return draft, lm_head


def run_in_subprocesses(
    args: argparse.Namespace, runs: list[tuple[str, int]], warmup: int, precision: str
) -> None:
    """CPU: each (attention, length) in a fresh process of this script, so each peak RSS is its own."""
    same = [
        "--size",
        args.size,
        "--batch",
        str(args.batch),
        "--ttt-steps",
        str(args.ttt_steps),
        "--kind",
        args.kind,
        "--cod",
        *map(str, args.cod),
        "--repeat",
        str(args.repeat),
        "--warmup",
        str(warmup),
        "--precision",
        precision,
        "--device",
        args.device,
        "--compile",
        args.compile,
        "--one-process",
        *(["--checkpoint-layer"] if args.checkpoint_layer else []),
        *(["--memory-limit-gb", str(args.memory_limit_gb)] if args.memory_limit_gb else []),
    ]
    for a, T in runs:
        r = subprocess.run([sys.executable, __file__, *same, "--attention", a, "--lengths", str(T)])
        if r.returncode:
            print(f"[{a}] T={T:6d}  OOM or killed (exit status {r.returncode})", flush=True)


def step_inputs(
    B: int, T: int, H: int, V: int, dev: torch.device, n_aux: int = 3
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Random (aux (B, T, n_aux * H), input ids (B, T), loss mask (B, T), doc ids (B, T)) and final
    (B, T, H), seeded by T."""
    g = torch.Generator().manual_seed(T)
    aux = torch.randn(B, T, n_aux * H, generator=g).to(dev)
    final = torch.randn(B, T, H, generator=g).to(dev)
    x = torch.randint(0, V, (B, T), generator=g).to(dev)
    mask = torch.ones(B, T, device=dev)
    doc = doc_ids_from_lengths(torch.full((B,), T), T).to(dev)
    return (aux, x, mask, doc), final


def measure_length(
    draft: Eagle3Draft,
    lm_head: torch.Tensor,
    attention: str,
    T: int,
    args: argparse.Namespace,
    autocast: AbstractContextManager,
    warmup: int,
) -> tuple[float, float, float, float] | None:
    """`warmup` untimed then --repeat timed training steps (forward + backward + AdamW) at length T.
    -> (median seconds per step, peak MiB, warm-up seconds, last loss); None when out of memory."""
    dev = torch.device(args.device)
    options = {
        "eagle3": {},
        "peagle": {"cod": tuple(args.cod), "cod_seed": (0, 0)},
        "dflash": {"anchors": 512, "anchor_seed": (0, 0), "dpace": 0.5},  # the gpt-oss-120b-dflash recipe's
    }[args.kind]
    module = TTTModule(
        draft,
        lm_head,
        args.ttt_steps,
        0.8,
        attention,
        args.checkpoint_layer,
        unroll=KINDS[args.kind].forward,
        options=options,
        rows=KINDS[args.kind].rows,  # the teacher at the rows the trainer computes it at
    ).to(dev)
    opt = torch.optim.AdamW(
        [q for q in module.parameters() if q.requires_grad], lr=1e-4, fused=dev.type == "cuda"
    )  # as the trainer
    V, H = lm_head.shape
    inputs, final = step_inputs(args.batch, T, H, V, dev, len(draft.config.aux_layer_ids))
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times, loss, t_warm = [], float("nan"), 0.0
    try:
        for i in range(warmup + args.repeat):
            t0 = time.perf_counter()
            loss = train_step(module, opt, autocast, inputs, final, dev)
            elapsed = time.perf_counter() - t0
            if i < warmup:
                t_warm += elapsed
            else:
                times.append(elapsed)
        if args.profile:
            profile_step(module, opt, autocast, inputs, final, dev, args.profile)
    except Exception as e:  # noqa: BLE001 -- reported, and the next length runs
        if not is_oom(e):
            raise
        opt.zero_grad(set_to_none=True)
        return None
    finally:
        del opt, module
    mem = (torch.cuda.max_memory_allocated() / 2**20) if dev.type == "cuda" else peak_rss_mb()
    return statistics.median(times), mem, t_warm, loss


def main() -> None:
    args = parse_args()
    dev = torch.device(args.device)
    precision = args.precision or ("bf16" if dev.type == "cuda" else "fp32")
    warmup = args.warmup if args.warmup is not None else (1 if dev.type == "cuda" else 0)
    runs = [(a, T) for a in args.attention for T in args.lengths]
    if args.memory_limit_gb:
        cap = int(args.memory_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    compiled = args.compile == "on" or (args.compile == "auto" and dev.type == "cuda")
    draft, lm_head = make_draft(args.size, compiled, args.kind, args.ttt_steps)
    if not args.one_process:
        print(
            f"size={args.size} kind={args.kind} trainable={draft.num_parameters() / 1e6:.1f}M "
            f"ttt_steps={args.ttt_steps} "
            f"batch={args.batch} device={dev} precision={precision} "
            f"checkpoint_layer={args.checkpoint_layer} compile={compiled}",
            flush=True,
        )
    if dev.type == "cpu" and not args.one_process and len(runs) > 1:
        run_in_subprocesses(args, runs, warmup, precision)
        return
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    counter = LmHeadRows()
    for attention, T in runs:
        counter.rows = 0
        got = measure_length(draft, lm_head, attention, T, args, autocast, warmup)
        if got is None:
            print(f"[{attention}] T={T:6d}  OOM", flush=True)
            continue
        sec, mem, t_warm, loss = got
        print(
            f"[{attention}] T={T:6d}  {sec:8.3f} s/step  {args.batch * T / sec:9.0f} tok/s  "
            f"peak {'GPU' if dev.type == 'cuda' else 'RSS'} {mem:9.0f} MiB  "
            f"(warm-up {t_warm:.1f} s, loss {loss:.4f}, lm_head rows a step "
            f"{counter.rows // (warmup + args.repeat):,})",
            flush=True,
        )


class LmHeadRows:
    """Counts the positions the draft's lm_head (and its loss) runs over, wrapping train/ttt.py's two loss
    paths: 6 x rows x H x V_d is the lm_head's FLOPs (forward and backward) a step."""

    def __init__(self) -> None:
        self.rows = 0
        for name in ("linear_loss", "reference_loss"):
            setattr(ttt, name, self.counting(getattr(ttt, name)))

    def counting(self, fn):
        def counted(*a, **kw):
            x = a[1] if fn.__name__ == "reference_loss" else a[0]  # (B, L, H) hidden states
            self.rows += x.shape[0] * x.shape[1]
            return fn(*a, **kw)

        counted.__name__ = fn.__name__
        return counted


def train_step(module, opt, autocast, inputs: tuple, final, dev: torch.device) -> float:
    """One TTT step: forward under `autocast`, backward, optimizer step; synchronized. -> its loss."""
    with autocast:
        out = module(*inputs, final=final)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return out.loss.item()


def profile_step(
    module: TTTModule,
    opt: torch.optim.Optimizer,
    autocast: AbstractContextManager,
    inputs: tuple[torch.Tensor, ...],
    final: torch.Tensor,
    dev: torch.device,
    top: int,
) -> None:
    """One more step under torch.profiler: the ops with the most self time on the device."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        train_step(module, opt, autocast, inputs, final, dev)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=60), flush=True)


if __name__ == "__main__":
    main()
