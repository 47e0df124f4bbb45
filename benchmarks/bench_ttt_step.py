"""TTT training-step time and peak memory vs sequence length, for a draft of a given size.

    python benchmarks/bench_ttt_step.py                       # demo-sized head, CPU
    python benchmarks/bench_ttt_step.py --size gpt-oss-120b --lengths 256 512 --device cuda

Prints one line per length: seconds per step (forward + backward + AdamW, median of
--repeat), tokens/s and peak memory (CUDA: torch.cuda.max_memory_allocated; CPU: the peak
RSS of a fresh process per length, so allocator reuse across lengths cannot hide growth).
"""

import argparse
import resource
import statistics
import subprocess
import sys
import time

import torch

from eyas.train.model import DraftConfig, Eagle3Draft
from eyas.train.ttt import TTTModule

SIZES = {
    # H, heads, kv heads, head_dim, intermediate, target vocab, draft vocab
    "demo": (128, 4, 2, 32, 512, 915, 256),  # recipes/demo.yaml on the built-in target
    "gpt-oss-120b": (2880, 64, 8, 64, 17280, 201088, 32000),
    # gpt-oss-120b's attention shape (64 heads of 64, 8 KV heads) with small H/MLP/vocab: what
    # the (T x T) attention blocks cost at that head count, on a machine without a GPU
    "gpt-oss-attention": (512, 64, 8, 64, 1024, 4096, 1024),
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", choices=SIZES, default="demo")
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--checkpoint-attention", action="store_true", help="recompute attention in backward")
    p.add_argument("--one-process", action="store_true", help="(internal) run the lengths in this process")
    args = p.parse_args()
    if args.device == "cpu" and not args.one_process and len(args.lengths) > 1:
        same = ["--size", args.size, "--batch", str(args.batch), "--ttt-steps", str(args.ttt_steps),
                "--repeat", str(args.repeat), "--device", args.device, "--one-process",
                *(["--checkpoint-attention"] if args.checkpoint_attention else [])]
        for T in args.lengths:
            subprocess.run([sys.executable, __file__, *same, "--lengths", str(T)], check=True)
        return
    H, nh, nkv, hd, inter, V, Vd = SIZES[args.size]
    dev = torch.device(args.device)
    cfg = DraftConfig(hidden_size=H, num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd,
                      intermediate_size=inter, vocab_size=V, draft_vocab_size=Vd, aux_layer_ids=[2, 18, 33])
    draft = Eagle3Draft(cfg)
    ids = torch.randperm(V)[:Vd].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    draft.set_vocab_map(ids - torch.arange(Vd), t2d)
    module = TTTModule(draft, torch.randn(V, H) * 0.02, args.ttt_steps, 0.8, args.checkpoint_attention).to(dev)
    opt = torch.optim.AdamW([q for q in module.parameters() if q.requires_grad], lr=1e-4)
    print(f"size={args.size} trainable={draft.num_parameters() / 1e6:.1f}M ttt_steps={args.ttt_steps} "
          f"batch={args.batch} device={dev} checkpoint_attention={args.checkpoint_attention}")
    for T in args.lengths:
        B = args.batch
        aux = torch.randn(B, T, 3 * H, device=dev)
        final = torch.randn(B, T, H, device=dev)
        x = torch.randint(0, V, (B, T), device=dev)
        mask = torch.ones(B, T, device=dev)
        lengths = torch.full((B,), T)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = module(aux, final, x, mask, lengths)
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        sec = statistics.median(times)
        mem = (torch.cuda.max_memory_allocated() / 2**20) if dev.type == "cuda" else peak_rss_mb()
        print(f"T={T:6d}  {sec:8.3f} s/step  {B * T / sec:9.0f} tok/s  peak {'GPU' if dev.type == 'cuda' else 'RSS'}"
              f" {mem:9.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
