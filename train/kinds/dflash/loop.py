"""DFlash's round in the serving loop (DraftKind.round): one non-causal forward of a block over the context
keys, and the commit, which writes committed positions' context keys."""

from __future__ import annotations

import torch

from eyas.serve.decoding import masks as M
from eyas.serve.decoding.tree import select_tree


def write_context(engine, row0: int, ids, hidden, pos, committed, write, spec_pos, vis, kv_len, last_only):
    """DFlash's commit: the context keys / values of these positions (hidden: fc(aux)) into the draft's
    cache at their slots; no draft logits (the block drafts from them next round). -> (None, None)."""
    engine.dcache.plan(row0, write, kv_len)
    engine.draft.write_context(hidden, pos, engine.dcache)
    return None, None


def propose_block(engine, n: torch.Tensor, n_max: int, B: int):
    """Step 2 for DFlash (train/kinds/dflash): one forward of the block [x_n, mask x k] at positions
    n..n+k over the context keys of positions < n, non-causal within the block; slot s drafts x_{n+s}
    (vLLM's DFlash proposer: num_speculative_tokens = k). A k below the block's drafts runs a shorter
    block, as vLLM does (non-causal: its slots see fewer mask slots than in training); eyas refuses it
    for a draft that records its trained block (DraftKind.untrained_k), runs it where none is.
    Greedy drafts, as a chain's."""
    k, dev, d = engine.shape.steps, engine.device, engine.draft
    S = k + 1
    ids = torch.full((B, S), d.config.mask_token_id, dtype=torch.long, device=dev)
    ids[:, 0] = engine.pending[:B]
    pos = n[:, None] + torch.arange(S, device=dev)  # (B, S) positions = their draft slots
    vis = torch.ones(B, S, S, dtype=torch.bool, device=dev)
    allowed = M.attention_allowed(n, pos, pos, vis, n_max + S)
    engine.dcache.plan(0, pos, n_max + S)
    p, i = d.block(ids, pos, engine.dcache, allowed)[:, 1:].float().softmax(-1).max(-1)  # (B, k)
    depth = torch.arange(1, k + 1, device=dev).expand(B, k)
    return select_tree(engine.pending[:B], d.to_target_ids(i), p.cumprod(1), depth - 2, depth, engine.shape)
