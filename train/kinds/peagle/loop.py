"""P-EAGLE's round in the serving loop (DraftKind.round): K drafts from one forward of mask slots; its commit
is EAGLE-3's draft step (eagle3/loop.py)."""

from __future__ import annotations

import torch

from eyas.serve.decoding.tree import select_tree

from ..eagle3.loop import draft_step


def propose_parallel(engine, n: torch.Tensor, n_max: int, B: int):
    """Step 2 for P-EAGLE (train/kinds/peagle): the chain's first draft from the head (the step-0 entry
    of x_n), the other K - 1 from ONE draft forward of mask slots at positions n..n+K-2, each seeing the
    committed entries and the slots before it (vLLM's parallel drafting). Greedy drafts, as a chain's."""
    K, dev, d = engine.shape.steps, engine.device, engine.draft
    p, i = engine.head_logits[:B].softmax(-1).max(-1)  # (B,) depth 0
    probs, ids = [p[:, None]], [i[:, None]]
    if K > 1:
        mask_ids, hidden = d.mask_inputs((B, K - 1))
        pos = n[:, None] + torch.arange(K - 1, device=dev)  # (B, K-1) positions = their draft slots
        vis = torch.ones(K - 1, K - 1, dtype=torch.bool, device=dev).tril()[None].expand(B, -1, -1)
        _, logits = draft_step(engine, 0, mask_ids, hidden, pos, n, pos, pos, vis, n_max + K - 1, False)
        p, i = logits.float().softmax(-1).max(-1)  # (B, K-1)
        probs.append(p)
        ids.append(i)
    depth = torch.arange(1, K + 1, device=dev).expand(B, K)
    return select_tree(
        engine.pending[:B],
        d.to_target_ids(torch.cat(ids, 1)),
        torch.cat(probs, 1).cumprod(1),  # a chain's scores: each node below its parent
        depth - 2,  # parents: the previous node (-1: the root)
        depth,
        engine.shape,
    )
