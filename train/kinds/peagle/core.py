"""P-EAGLE: all K drafts of a round from ONE draft forward (parallel drafting, arXiv 2602.01469).

The draft is EAGLE-3's (`train/model.py`: fc over the aux states, the same decoder layers, norm, lm_head),
plus two things that stand in for what a parallel slot does not have:

    mask_token_id   the input token of every slot past the first (the draft config's `mask_token_id`,
                    exported as vLLM's `pard_token`)
    mask_hidden     (1, n_aux * H_t) learnable: the aux states of those slots, fused by fc like real ones

One round, after the target verified up to x_n (draft cache: step-0 entries for positions 0..n-1):

    slot      0                  1            2           ...  K-1
    token     x_n (pending)      mask         mask             mask       (the step-0 entry at n-1 is slot 0;
    hidden    fc(aux_{n-1})      fc(mask_h)   fc(mask_h)       fc(mask_h)  the loop already ran it)
    position  n-1                n            n+1              n+K-2
    predicts  x_{n+1}            x_{n+2}      x_{n+3}          x_{n+K}
                 causal attention over the committed entries and the earlier slots

so depth d of an anchor i (slot d after the step-0 entry at i) predicts x_{i+2+d} from the context up to
x_{i+1} and its own slots 1..d -- EAGLE-3's TTT attention pattern (`train/attention.py`: the step-0
prefix, causal, plus the index's own chain), with mask inputs instead of the chain's own outputs. So
training reuses TTT's attention, its teacher (`TargetView`), its loss and its counts (`train/ttt.py`); a
depth's inputs do not depend on the depth before it.

COD sampling (training only; validation keeps every anchor so its counts and replay are TTT's): depth d
keeps a random share max(cod_ratio**d, cod_floor) of the counted positions, drawn from the anchors depth
d-1 kept (nested: a kept slot's earlier slots are all there; speculators' `generate_cod_sample_indices`).
The layers' projections, MLPs and norms run over the kept anchors only, so their memory grows as
sum_d max(r**d, floor) x T instead of depths x T (r = 0.7, floor 0.2, 8 depths: 3.37 T, not 8 T). Two parts
stay on the whole (B, T) grid, zeros off the anchors: the attention call (the kernels of
`train/attention.py` take queries where their index is: a (T x T) pass per depth, as TTT's, O(T) memory)
and the teacher (computed for every position). The loss (TTT's `score_step`) gathers the kept anchors' states
and teacher rows before the lm_head (`rows`), so depth d's lm_head runs over its kept share only.
`eyas plan` prices both (eyas/plan/cost.py).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from eyas.train.kinds.config import DraftConfig

from ...attention import resolve
from ...grids import from_grid, row_seeds, shift_right, to_grid
from ...model import Eagle3Draft, KVCache, attention_scale
from ...packing import positions_in_doc
from ...ttt import (
    ChainState,
    StepInput,
    TargetView,
    TTTOutput,
    draft_step,
    fill_counts,
    read_rows,
    score_step,
    shift,
    step_attention,
)
from . import cod_share


class PEagleDraft(Eagle3Draft):
    """EAGLE-3's draft plus the mask slots' inputs: `mask_hidden` (1, n_aux * H_t), config.mask_token_id."""

    def __init__(self, cfg: DraftConfig):
        if cfg.mask_token_id is None or not 0 <= cfg.mask_token_id < cfg.vocab_size:
            raise ValueError(
                f"a P-EAGLE draft needs draft.mask_token_id in [0, {cfg.vocab_size}), got {cfg.mask_token_id}"
            )
        super().__init__(cfg)
        self.mask_hidden = MaskHidden(cfg.fc_in_features)

    def mask_inputs(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask slots' (token ids `shape`, fused hidden `shape` + (H,)): one mask token and
        fc(mask_hidden) for every slot (vLLM's llm_base_proposer: combine_hidden_states(mask_hidden))."""
        hidden = self.fuse(self.mask_hidden())[0]  # (H,)
        ids = torch.full(shape, self.config.mask_token_id, dtype=torch.long, device=hidden.device)
        return ids, hidden.expand(*shape, -1)

    @torch.no_grad()
    def fixed_round(self, ids: torch.Tensor, aux: torch.Tensor, pos: torch.Tensor) -> list[torch.Tensor]:
        """The prefix's logits (B, T, V_d), then the round's other 3 drafts: one forward of mask slots (its
        mask token and mask_hidden) -> (B, 3, V_d)."""
        cache = KVCache()
        _, first = self.step(ids, self.fuse(aux), pos, cache)
        slots = pos[:, -1:] + torch.arange(1, 4)
        _, second = self.step(*self.mask_inputs(tuple(slots.shape)), slots, cache)
        return [first, second]


class MaskHidden(nn.Module):
    """The mask slots' learned aux states, `weight` (1, n_aux * H_t), published as the tensor `mask_hidden`
    (serve/interchange/formats.py). A module of its own, read through its forward: DeepSpeed ZeRO-3 gathers
    a partitioned parameter in its module's forward only."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, width))
        nn.init.normal_(self.weight)  # std 1, as speculators' randn: comparable to normed aux states

    def forward(self) -> torch.Tensor:
        return self.weight


def cod_anchors(
    valid: list[torch.Tensor], ratio: float, floor: float, seeds: list[int] | None = None
) -> list[torch.Tensor]:
    """COD sampling, row by row. valid[d] (B, T) bool: where depth d's prediction counts -> kept[d] (B, T)
    bool for d >= 1, nested (kept[d] within kept[d-1] and valid[d]), int(n_b * cod_share(d)) anchors of each
    row b with n_b counted depth-0 positions (all candidates when fewer). A share of 1 keeps every position,
    counted or not (a later depth's slot attends to the earlier ones of its anchor, which a gap in the loss
    mask must not drop): the counts are then TTT's. `seeds` (B,): each row's draws from its own generator
    (row_seeds), so a row keeps the same anchors however the processes deal the rows out; None: the global
    generator."""
    B = valid[0].shape[0]
    gens = [torch.Generator().manual_seed(s) for s in seeds] if seeds is not None else [None] * B
    kept, prev = [], torch.ones_like(valid[0])
    for d in range(1, len(valid)):
        share = cod_share(d, ratio, floor)
        if share >= 1:
            kept.append(prev)
            continue
        cand = valid[d] & prev
        rows = []
        for b in range(B):
            flat = cand[b].nonzero().squeeze(-1)
            size = int(int(valid[0][b].sum()) * share)
            row = cand[b]
            if flat.numel() > size:
                pick = torch.randperm(flat.numel(), generator=gens[b])[:size].to(flat.device)
                row = torch.zeros_like(row)
                row[flat[pick]] = True
            rows.append(row)
        prev = torch.stack(rows)
        kept.append(prev)
    return kept


def counted_at(d: int, loss_mask: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: index i's depth-d prediction, of x_{i+2+d}, counts (loss-masked, in i's own sequence)."""
    ahead = 2 + d
    return shift(loss_mask.bool(), ahead, False) & (shift(doc_ids, ahead, -1) == doc_ids)


def cod_forward(
    draft: PEagleDraft,
    aux: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    doc_ids: torch.Tensor,
    target: TargetView | None,
    depths: int,
    decay: float = 0.8,
    attention: str = "auto",
    keep_logits: bool = False,
    checkpoint_layer: bool = False,
    loss: str = "kl",
    sampled_text: bool = False,
    sp=None,
    cod: tuple[float, float] = (1.0, 1.0),
    cod_seed: tuple[int, ...] | None = None,
) -> TTTOutput:
    """`depths` parallel depths over a right-padded (optionally packed) batch: TTT's inputs and outputs
    (`train/ttt.py` ttt_forward, whose counts, loss and teacher these are), depth d in the place of TTT step
    d. aux (B, T, n_aux*H_t); input_ids, loss_mask, doc_ids (B, T). `cod` (ratio, floor): the share of the
    counted positions each depth keeps (module docstring); (1, 1) keeps them all; `cod_seed` seeds each row's
    draws with its tokens (row_seeds; None: the global generator). With `keep_logits` (or no
    target) out.logits[d] (B, T, V_d) holds depth d's logits at its kept anchors, zeros elsewhere.
    `sp` (train/sequence_parallel.py), as ttt_forward: this process computes its shard [lo, hi) of each row
    (aux and logits on it; the target on it and its halo), attention crosses the group's ranks; every rank
    draws the anchors over the whole row (its tokens are whole there) and keeps its shard's; the counts and
    run_length come back for the whole row."""
    B, T = input_ids.shape
    lo, hi, ext = sp.bounds(T) if sp is not None else (0, T, T)
    impl = resolve(attention, input_ids.device, draft.config.sliding_window)
    pos = positions_in_doc(doc_ids)[:, lo:hi]  # (B, n) RoPE positions, restarting per packed sequence
    valid = [counted_at(d, loss_mask, doc_ids) for d in range(depths)]
    if sp is not None and cod_seed is None and cod[0] < 1:
        raise ValueError(
            "COD under sequence parallelism needs cod_seed: every rank must draw the same anchors"
        )
    seeds = row_seeds(cod_seed, input_ids, valid[0]) if cod_seed is not None and cod[0] < 1 else None
    kept = [torch.ones_like(valid[0]), *cod_anchors(valid, *cod, seeds)]  # (B, T) each, the whole row

    hidden = draft.fuse(aux)  # (B, n, H) depth 0: EAGLE-3's step 0
    kv = [([], []) for _ in draft.decoder_layers]
    embeds = draft.embed_tokens(shift(input_ids, 1)[:, lo:hi]).to(hidden.dtype)
    cos, sin = draft.rotary(pos, hidden.dtype)
    scale = attention_scale(draft.config.head_dim)
    run = StepInput(impl, scale, draft.config.sliding_window, sp, doc_ids, embeds, cos, sin)
    prenorm = draft_step(draft, hidden, kv, run, checkpoint_layer)  # (B, n, H), kv: the step-0 keys

    out = TTTOutput(hidden.new_zeros((), dtype=torch.float32), [], [], [], [], [])
    out.run_length = torch.zeros_like(input_ids[:, lo:hi])
    chain, stats, total = ChainState.start(B, hi - lo, input_ids.device), [], out.loss
    for d in range(depths):
        mine = kept[d][:, lo:hi]  # (B, n) this shard's kept anchors
        if d:
            flat = mine.flatten().nonzero().squeeze(-1)  # (N,) b * n + i
            prenorm = depth_forward(draft, kv, flat, d, pos, run, checkpoint_layer)
        if target is None or keep_logits:
            out.logits.append(draft.logits(prenorm) * mine[..., None])
        if target is None:
            continue
        # TTT's score of step d, its counts restricted to the kept anchors (a prediction of x_{i+2+d} counts
        # where anchor i was kept): the loss and counts of the kept anchors only
        masked = loss_mask.bool() & shift_right(kept[d], 2 + d)
        batch = (input_ids[:, lo:ext], masked[:, lo:ext], doc_ids[:, lo:ext])  # the shard and its halo
        loss_d, step, chain = score_step(
            draft, prenorm, d, batch, target, chain, loss, sampled_text, sp, rows=mine if d else None
        )
        chain.text &= mine[:, : chain.text.shape[1]]
        out.run_length[:, : chain.text.shape[1]] += chain.text
        total = total + (decay**d) * loss_d
        stats.append(step)
    out.loss = total
    stats = torch.stack(stats) if stats else None
    if sp is not None:  # the whole row's counts and chains on every rank of the group
        stats = sp.sum(stats) if stats is not None else None
        out.run_length = sp.gather(out.run_length)
    fill_counts(out, stats, decay)
    return out


def depth_forward(
    draft: PEagleDraft, kv: list, flat: torch.Tensor, d: int, pos: torch.Tensor, run: StepInput, ckpt: bool
) -> torch.Tensor:
    """Depth d >= 1 at the kept anchors `flat` (N,) (b * n + i) of the (B, n) positions `pos` (n = T, or the
    shard's under run.sp): the mask slots through every layer, each attending to the step-0 keys up to its
    anchor and its own slots 1..d. kv: per layer ([keys], [values]) of depths 0..d-1 on the (B, n_kv, T, d)
    grid (run.sp: this rank's heads); this depth's are appended. -> prenorm (B, n, H), zeros off the
    anchors."""
    B, n = pos.shape
    ids, hidden = draft.mask_inputs((1, flat.numel()))  # (1, N), (1, N, H)
    embeds = draft.embed_tokens(ids).to(hidden.dtype)
    cos, sin = draft.rotary(pos.reshape(1, -1)[:, flat] + d, hidden.dtype)  # slot d of anchor i: pos_i + d
    at = StepInput(run.impl, run.scale, run.window, run.sp, run.doc_ids, embeds, cos, sin)
    step = functools.partial(cod_layer_step, flat=flat, grid=(B, n))
    return to_grid(draft_step(draft, hidden, kv, at, ckpt, step), flat, B, n)


def cod_layer_step(layer, run: StepInput, hidden: torch.Tensor, *kv, flat: torch.Tensor, grid: tuple):
    """One depth through one decoder layer at the anchors `flat` (N,) of the (B, n) `grid`: hidden (1, N, H);
    kv: keys then values of the earlier depths on the grid (B, n_kv, T, d). -> (output (1, N, H), this
    depth's keys, values on the grid). The attention kernels want queries where their index is
    (train/attention.py), so q, k and v go onto the (B, heads, n, d) grid, zeros off the anchors (never seen:
    a kept anchor's slots lie on kept anchors); under run.sp the grid's shards then cross the group as TTT's
    steps do (layer_step), and the keys are kept in that layout."""
    seen = []
    across = step_attention(run, kv, seen)

    def on_grid(t):  # (1, h, N, d) -> (B, h, n, d)
        return to_grid(t.transpose(1, 2), flat, *grid).transpose(1, 2)

    def attend(q, k, v):
        o = across(on_grid(q), on_grid(k), on_grid(v))
        return from_grid(o.transpose(1, 2), flat).transpose(1, 2)  # (1, heads, N, d)

    out, _, _ = layer(run.embeds, hidden, run.cos, run.sin, attend, repeat_kv=False)
    return out, *seen[0]


MODEL, UNROLL, ROWS = PEagleDraft, cod_forward, read_rows  # read by the kind (train/kinds/base.py core)
