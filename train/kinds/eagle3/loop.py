"""EAGLE-3's round in the serving loop (serve/decoding/engine.py calls it through DraftKind.round): the
proposal, a dynamic tree (a chain when topk = 1) of draft forwards, and the commit, the draft's step 0 over
committed positions. `engine`: the Engine (its draft, draft cache, head, pending tokens and shape).
P-EAGLE proposes with EAGLE-3's draft step (peagle/loop.py) and commits as EAGLE-3 does."""

from __future__ import annotations

import torch

from eyas.serve.decoding import masks as M
from eyas.serve.decoding.tree import select_tree


def draft_step(
    engine, row0: int, ids, hidden, pos, committed, spec_slots, spec_pos, vis, kv_len, last_only: bool
):
    """The draft's forward over `ids` (B, q) at `pos` into its cache slots `spec_slots[:, -q:]`, attending
    to the committed entries and the visible speculative ones (masks.attention_allowed) -> (output state,
    logits: the last position's only with `last_only`)."""
    q = ids.shape[1]
    window = engine.draft.config.sliding_window  # the draft's own window (draft.sliding_window), if any
    allowed = M.attention_allowed(committed, spec_slots, spec_pos, vis, kv_len, window)
    engine.dcache.plan(row0, spec_slots[:, -q:], kv_len)
    return engine.draft.step(
        ids, hidden, pos, engine.dcache, attn_mask=allowed, logits_to_keep=1 if last_only else 0
    )


def propose_tree(engine, n: torch.Tensor, n_max: int, B: int):
    """Step 2: the dynamic tree (a chain when topk = 1) of every row."""
    S, K = engine.shape.steps, engine.shape.topk
    dev = engine.device
    d = engine.draft
    probs = engine.head_logits[:B].softmax(-1)
    p1, i1 = probs.topk(K, dim=-1)  # (B, K), decreasing
    tok = d.to_target_ids(i1)
    cand_tok, cand_score = [tok], [p1]
    cand_par = [torch.full((B, K), -1, dtype=torch.long, device=dev)]
    cand_depth = [torch.ones(B, K, dtype=torch.long, device=dev)]
    f_tok, f_score, f_cand = tok, p1, torch.arange(K, device=dev).expand(B, K)
    f_hidden = engine.head_state[:B, None].expand(B, K, -1)
    fed_vis = torch.zeros(B, K, 0, dtype=torch.bool, device=dev)  # frontier x earlier fed entries
    eye = torch.eye(K, dtype=torch.bool, device=dev)[None].expand(B, K, K)
    spec_slots = torch.zeros(B, 0, dtype=torch.long, device=dev)
    spec_pos = torch.zeros(B, 0, dtype=torch.long, device=dev)
    base = K
    for s in range(1, min(S, engine.shape.num_draft_tokens - 1)):  # deeper levels could hold no chosen node
        pos = (n + s - 1)[:, None].expand(B, K)
        spec_slots = torch.cat([spec_slots, n[:, None] + (s - 1) * K + torch.arange(K, device=dev)], 1)
        spec_pos = torch.cat([spec_pos, pos], 1)
        vis = torch.cat([fed_vis, eye], 2)
        h, logits = draft_step(
            engine, 0, f_tok, f_hidden, pos, n, spec_slots, spec_pos, vis, n_max + s * K, last_only=False
        )
        cp, ci = logits.float().softmax(-1).topk(K, dim=-1)  # (B, K, K)
        c_score = (f_score[:, :, None] * cp).reshape(B, K * K)
        c_tok = d.to_target_ids(ci).reshape(B, K * K)
        cand_tok.append(c_tok)
        cand_score.append(c_score)
        cand_par.append(f_cand[:, :, None].expand(B, K, K).reshape(B, K * K))
        cand_depth.append(torch.full((B, K * K), s + 1, dtype=torch.long, device=dev))
        sel = c_score.topk(K, dim=-1).indices  # the next frontier
        parent = sel // K
        f_tok, f_score = c_tok.gather(1, sel), c_score.gather(1, sel)
        f_cand = base + sel
        f_hidden = h.gather(1, parent[:, :, None].expand(B, K, h.shape[-1]))
        fed_vis = vis.gather(1, parent[:, :, None].expand(B, K, vis.shape[-1]))
        base += K * K
    return select_tree(
        engine.pending[:B],
        torch.cat(cand_tok, 1),
        torch.cat(cand_score, 1),
        torch.cat(cand_par, 1),
        torch.cat(cand_depth, 1),
        engine.shape,
    )
