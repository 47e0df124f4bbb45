"""Capture's forward against `eyas plan`'s FLOP count (eyas/plan/flops.py): one forward of the recipe's
target's decoder (capture stops at the lm_head's input) over T tokens, unpadded (transformers runs SDPA
causal, skipping the masked half) and with one padding token (a padding mask: every pair of T x T), best of
--repeat each, in turn; the time ratio beside the FLOP ratio, and the FLOP/s of each.

    python benchmarks/bench_capture_flops.py [--recipe recipes/smollm2-135m-long-context.yaml] [--tokens 3072]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from eyas.data.target import count_target, load_recipe_target, text_config
from eyas.plan.flops import capture_work, forward_cost
from eyas.recipes.load import load_recipe


def forward_s(decoder, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """One forward's seconds (no grad, no cache)."""
    t0 = time.perf_counter()
    with torch.no_grad():
        decoder(input_ids=ids, attention_mask=mask, use_cache=False)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/smollm2-135m-long-context.yaml")
    p.add_argument("--tokens", type=int, default=3072)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    recipe = load_recipe(args.recipe)
    model, _ = load_recipe_target(recipe.target)
    decoder = model.get_decoder()  # the layers and the final norm: no lm_head, as capture runs it
    cfg = text_config(model.config)
    T = args.tokens
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    whole = torch.ones(1, T, dtype=torch.long)
    padded = whole.clone()
    padded[0, -1] = 0  # one padding token: transformers passes SDPA a mask
    forward_s(decoder, ids[:, :256], whole[:, :256])  # warm up
    times = {"unpadded": [], "padded": []}
    for _ in range(args.repeat):
        times["unpadded"].append(forward_s(decoder, ids, whole))
        times["padded"].append(forward_s(decoder, ids, padded))
    cost = forward_cost(model.config, count_target(model.config), recipe.capture)
    # the same T-token sequence as capture counts it: alone (causal), or in a batch padded to T + 1
    flops = {
        "unpadded": capture_work(cost, [T]).flops,
        "padded": capture_work(cost, [T, T - 1]).flops / 2,  # each row of a padded batch of 2 runs T x T
    }
    dtype = next(decoder.parameters()).dtype
    threads = torch.get_num_threads()
    print(f"{recipe.target.model}, {T} tokens, {dtype}, {threads} threads, best of {args.repeat}")
    for name, v in times.items():
        rate = flops[name] / min(v) / 1e9
        print(f"  {name:9s} {min(v):7.2f} s  {flops[name] / 1e9:8.1f} GFLOP  {rate:6.1f} GFLOP/s")
    ratio = min(times["unpadded"]) / min(times["padded"])
    print(f"  unpadded / padded: time {ratio:.3f}, FLOPs {flops['unpadded'] / flops['padded']:.3f}")


if __name__ == "__main__":
    main()
