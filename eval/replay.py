"""Drafts scored along text, as training validates them: the greedy loop's τ without running the loop.

    score_drafts   each draft's TTT over captured sequences (train/validation.py `validate`): simulated τ
                   (a chain from every position), at T = 1, and replayed τ (the greedy loop's own rounds)

The text scored: eyas/pipeline.py `answers_run`, the loop's prompts answered greedily by the target (HF
generate, the loop's dtype, up to eval.max_new_tokens) and captured. On the target's own greedy text a
draft's replayed τ is the greedy loop's τ on those prompts (tests/test_replay.py holds them equal), so a
draft can be compared on the same text without the loop's batching; benchmarks/bench_anchors.py --probe
uses both.
"""

from __future__ import annotations

from functools import partial

import torch

from eyas.data.target import load_head_weights
from eyas.train.kinds import kind_of
from eyas.train.packing import PackedRows, collate_rows
from eyas.train.ttt import TTTModule
from eyas.train.validation import sampled_at_t1, validate


def score_drafts(
    recipe, seqs, indices: list[int], drafts: list[tuple[str, str]], ttt, max_length: int, sampled_text=None
) -> list[tuple[str, dict]]:
    """Each draft (name, checkpoint) over the captured sequences `seqs[i]`, i in `indices` (rows of up to
    max_length tokens, 8 per batch), as training validates; `ttt`: an int or one per draft; `sampled_text`:
    whether they are the target's T = 1 samples (None: as the recipe's data says) -> [(name,
    train/validation.py's metrics: simulated_tau, simulated_tau_t1, replayed_tau at k = 1..ttt, ...)]."""
    from accelerate import Accelerator

    from eyas.train.checkpoint import load_draft  # lazy: safetensors
    from eyas.train.trainer import mixed_precision  # lazy: httpx, safetensors

    heads = load_head_weights(recipe.target.model, recipe.target.trust_remote_code)
    acc = Accelerator(
        cpu=not torch.cuda.is_available(), mixed_precision=mixed_precision(recipe.train.mixed_precision)
    )
    collate = partial(collate_rows, max_length=max_length)
    rows = PackedRows(seqs, [[i] for i in indices])
    n = len(indices)
    batches = [collate([rows[j] for j in range(b, min(b + 8, n))]) for b in range(0, n, 8)]
    steps = ttt if isinstance(ttt, list) else [ttt] * len(drafts)
    sampled = sampled_at_t1(recipe.data) if sampled_text is None else sampled_text
    out = []
    for (name, ckpt), t in zip(drafts, steps):
        draft = load_draft(ckpt, device=acc.device, embed=heads["embed"])
        lm_head = heads["lm_head"].float().to(acc.device)
        # the kind's unroll (a P-EAGLE draft's depths, every anchor kept) as its training validates
        module = TTTModule(draft, lm_head, t, 1.0, sampled_text=sampled, unroll=kind_of(draft.config).forward)
        with acc.autocast():
            out.append((name, validate(module, batches, acc, t)))
    return out
