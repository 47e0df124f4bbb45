"""Acceptance at each position of long prompts: how well a draft predicts the target along documents it never
saw, by the position in them (what makes τ fall with prompt length).

    python benchmarks/bench_prompt_positions.py --draft short=RUN/train/checkpoint-final --draft long=... \
        [--set essays-long-8k] [--prompts 8] [--min-tokens 4096] [--window 1024 256] [--k 3] \
        [--recipe recipes/smollm2-135m-long-context.yaml] [--out runs/bench-positions] [-- key=value ...]

The prompts: --prompts of --set's test split (data/long_sets.py; by default a source neither SmolLM2 recipe
trains on) whose prompt on the target's chat template has at least --min-tokens tokens and fits its context
less eval.max_new_tokens, spread over the set; answered greedily by the target and captured (eyas/pipeline.py
answers_run: HF generate in eval's dtype, 16 new tokens: the prompt is what is scored here). Every index of a
sequence is scored as training scores an answer (train/ttt.py, teacher-forced along the text): a chain of --k
drafts starts there, each draft counted right where it is the target's own greedy next token. Per bucket of
the index (its absolute position): acc_0 (the first draft right: a greedy loop's first acceptance there) and
τ_k = 1 + sum_j prod_{i<=j} cond_acc_i (train/ttt.py simulated_tau: a chain goes on where its drafts were
right and the text it is fed is the target's greedy token, as in training's validation). A chain is
counted at the index it starts from, ignoring the capture's loss mask (the prompt is what is scored).

Each draft is scored as trained (its config's window, or none), then with draft.sliding_window = W for each
--window (the same weights, the window set in its config): with a window the draft attends to the last W
positions only, and since RoPE depends on the distance between positions, not on where they are, a windowed
draft sees no distance beyond W at any position. Falling with position under full attention and flat under a
window: the draft's attention over a long context. Falling under both: the text, or how predictable the
target is further into a document, which drafts trained on long data (long against short) may learn. Prints
one table (and OUT/positions.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

from eyas.data.chat import render_prompt
from eyas.data.shards import ShardDataset
from eyas.data.target import load_head_weights, resolve_path
from eyas.eval.benchmarks import load_benchmark, spread
from eyas.pipeline import answers_run
from eyas.recipes.load import load_recipe
from eyas.train.packing import collate_rows
from eyas.train.ttt import simulated_tau, target_view, ttt_forward

BUCKETS = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def long_prompts(args, recipe) -> list[list[dict]]:
    """--prompts of --set's test split, each of at least --min-tokens rendered, fitting the context."""
    from transformers import AutoConfig, AutoTokenizer

    target = resolve_path(recipe.target.model)
    tok = AutoTokenizer.from_pretrained(target, trust_remote_code=recipe.target.trust_remote_code)
    cfg = AutoConfig.from_pretrained(target, trust_remote_code=recipe.target.trust_remote_code)
    room = cfg.max_position_embeddings - recipe.eval.max_new_tokens
    kept = [
        m
        for m in load_benchmark(args.set, args.set).messages
        if args.min_tokens <= len(render_prompt(tok, m)) <= room
    ]
    if not kept:
        raise SystemExit(f"--set {args.set}: no test prompt of {args.min_tokens} to {room} tokens")
    return spread(kept, args.prompts)


def score(recipe, seqs: ShardDataset, checkpoint: str, window: int | None, k: int) -> dict[str, list]:
    """`window`: draft.sliding_window to serve it with (None: as trained, its config's)."""
    # -> {bucket: per step j: [counted, right, chains alive before j, right among them]} (train/ttt.py
    # score_step's counts, per index instead of summed)
    from eyas.train.checkpoint import load_draft  # lazy: safetensors

    heads = load_head_weights(recipe.target.model, recipe.target.trust_remote_code)
    draft = load_draft(checkpoint, embed=heads["embed"])
    if draft.config.kind != "eagle3":  # ttt_forward is EAGLE-3's unroll; the others draft other chains
        raise SystemExit(f"{checkpoint}: a {draft.config.kind} draft; this benchmark scores EAGLE-3 drafts")
    if window is not None:
        draft.config.sliding_window = window
    draft.eval()
    dtype = torch.bfloat16 if recipe.train.mixed_precision in ("bf16", "auto") else torch.float32
    counts: dict[str, list] = {}
    for i in range(len(seqs)):
        b = collate_rows([[seqs[i]]], max_length=seqs.lengths[i])
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            view = target_view(b["final"], heads["lm_head"], draft)
            out = ttt_forward(
                draft, b["aux"], b["input_ids"], b["loss_mask"], b["doc_ids"], view, k, keep_logits=True
            )
        ids, T = b["input_ids"][0], b["input_ids"].shape[1]
        alive = torch.ones(T - 2, dtype=torch.bool)  # a greedy chain from index i, before step j
        for j in range(k):
            L = T - 2 - j  # prediction (j, i) is of x_{i+2+j}; the target's z_{i+1+j} (score_step)
            argmax = view.argmax[0, 1 + j : 1 + j + L]
            right = draft.to_target_ids(out.logits[j][0, :L].float().argmax(-1)) == argmax
            for c, (r, a) in _by_bucket(right, alive[:L]).items():
                row = counts.setdefault(c, [[0, 0, 0, 0] for _ in range(k)])[j]
                row[0], row[1], row[2], row[3] = (
                    row[0] + len(r),
                    row[1] + r.sum(),
                    row[2] + a.sum(),
                    row[3] + (r & a).sum(),
                )
            alive = alive[:L] & right & (ids[2 + j : 2 + j + L] == argmax)  # and the text fed is greedy
    return {c: [[int(x) for x in row] for row in rows] for c, rows in counts.items()}


def _by_bucket(right: torch.Tensor, alive: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Index i's values grouped by bucket(i)."""
    out = {}
    for lo, hi in zip(BUCKETS, BUCKETS[1:]):
        if lo < len(right):
            out[f"{lo}-{hi}"] = (right[lo:hi], alive[lo:hi])
    return out


def table(rows: dict[str, dict[str, list]], k: int) -> list[str]:
    """Per draft and bucket: acc_0 (the first draft right) / τ_k (1 + the chains' conditional acceptances
    multiplied out, train/ttt.py simulated_tau)."""
    cols = sorted({b for r in rows.values() for b in r}, key=lambda b: int(b.split("-")[0]))
    lines = [
        "",
        f"acc_0 / τ_{k} by position in the sequence (teacher-forced along the prompt, greedy chains)",
        "",
        f"| draft | {' | '.join(cols)} |",
        "|" + "---|" * (len(cols) + 1),
    ]
    for name, r in rows.items():
        cells = []
        for c in cols:
            steps = r.get(c)
            if not steps or not steps[0][0]:
                cells.append("—")
                continue
            tau = simulated_tau([right / max(base, 1) for _, _, base, right in steps])[-1]
            cells.append(f"{steps[0][1] / steps[0][0]:.3f} / {tau:.3f}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    counted = {c: max(r[c][0][0] for r in rows.values() if c in r) for c in cols}
    return lines + ["", "indices per bucket: " + ", ".join(f"{c} {n:,}" for c, n in counted.items())]


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", action="append", required=True, help="NAME=CHECKPOINT (an EAGLE-3 draft)")
    p.add_argument("--set", default="essays-long-8k", help="long prompt set (data/long_sets.py), test split")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--min-tokens", type=int, default=4096)
    p.add_argument("--window", type=int, nargs="*", default=[1024, 256])
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--recipe", default="recipes/smollm2-135m-long-context.yaml")
    p.add_argument("--out", default="runs/bench-positions")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    recipe = load_recipe(args.recipe, args.overrides)
    out = Path(args.out)
    messages = long_prompts(args, recipe)
    over = ["eval.max_new_tokens=16", *args.overrides]
    key = hashlib.sha256(json.dumps([args.recipe, over, messages]).encode()).hexdigest()[:12]
    capture = answers_run(args.recipe, messages, out / f"answers-{args.set}-{len(messages)}-{key}", over)
    seqs = ShardDataset(capture)
    print(f"{len(seqs)} sequences of {args.set}: {sum(seqs.lengths):,} tokens", flush=True)
    rows = {}
    for spec in args.draft:
        name, ckpt = spec.split("=", 1)
        for window in [None, *args.window]:
            label = name if window is None else f"{name}, window {window}"  # None: as trained
            rows[label] = score(recipe, seqs, ckpt, window, args.k)
            print(json.dumps({"draft": label, "counts": rows[label]}), flush=True)
    (out / "positions.json").write_text(json.dumps({"k": args.k, "set": args.set, "rows": rows}, indent=1))
    print("\n".join(table(rows, args.k)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
