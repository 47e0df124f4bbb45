"""Draft kinds: one module a kind, one registry, the same faces for every kind.

    kind     model (train/)                 training unroll                    a round in the loop
    eagle3   Eagle3Draft   train/model.py   ttt_forward   train/ttt.py        a chain / tree of draft forwards
    peagle   PEagleDraft   train/peagle.py  cod_forward   train/peagle.py     K drafts from one forward
    dflash   DFlashDraft   train/dflash.py  dflash_forward train/dflash.py    a block of drafts, one forward

The recipe picks one with `draft.kind`; a checkpoint's config says its own (DraftConfig.kind). What differs
between the kinds is here, read by the stages through `kind_of(config)` / `KINDS[name]`: the model, the
training unroll and its recipe options, whether it proposes trees, the draft forwards of a round (k advice)
and the steps' worth of activations a training row costs (`eyas plan`). The loop's proposal functions
(serve/decoding/engine.py) and the export keys (serve/interchange/formats.py) keep their own tables, keyed
by the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .dflash import DFlashDraft, dflash_forward
from .model import DraftConfig, Eagle3Draft
from .peagle import PEagleDraft, cod_forward, cod_share
from .ttt import ttt_forward


@dataclass(frozen=True)
class Kind:
    model: type  # built from a DraftConfig: Eagle3Draft or a kind of its own with the same faces
    forward: Callable  # the training unroll: (draft, aux, input_ids, loss_mask, doc_ids, target, steps, ...)
    options: Callable  # train section -> the unroll's own keyword options in training ({}: none)
    chains_only: bool  # proposes chains only (no trees)
    draft_forwards: Callable  # TreeShape -> draft forwards of one round (the step over the accepted path too)
    unrolled: Callable  # train section -> one row's steps' worth of per-token activations and compute
    # train section -> the steps' worth of the attention's and the loss's tensors that stay on the whole
    # (B, T) grid beyond `unrolled` (P-EAGLE: each depth's grid, less its COD share)
    on_grid: Callable
    summary: str
    # train.sequence_parallel splits the attention's heads over a row's ranks (Ulysses: P divides them);
    # DFlash gathers the row's context instead (train/sequence_parallel.py)
    sp_splits_heads: bool = True
    # a draft forward's first lm_head row is its anchor token's, which proposes nothing (DFlash's block)
    anchor_row: bool = False


KINDS = {
    "eagle3": Kind(
        Eagle3Draft,
        ttt_forward,
        options=lambda tr: {},
        chains_only=False,
        draft_forwards=lambda shape: shape.steps,
        unrolled=lambda tr: float(tr.ttt_steps),
        on_grid=lambda tr: 0.0,
        summary="EAGLE-3: one draft forward per drafted token (TTT)",
    ),
    "peagle": Kind(
        PEagleDraft,
        cod_forward,
        # COD sampling, drawn per row from its tokens and the epoch (train/trainer.py reseed)
        options=lambda tr: {"cod": (tr.cod_ratio, tr.cod_floor), "cod_seed": (tr.seed, 0)},
        chains_only=True,
        draft_forwards=lambda shape: min(shape.steps, 2),
        # depth 0 over every position, depth d over COD's share of them (train/peagle.py)
        unrolled=lambda tr: (
            1.0 + sum(cod_share(d, tr.cod_ratio, tr.cod_floor) for d in range(1, tr.ttt_steps))
        ),
        on_grid=lambda tr: sum(1 - cod_share(d, tr.cod_ratio, tr.cod_floor) for d in range(1, tr.ttt_steps)),
        summary="P-EAGLE: all K drafts from one forward (COD-sampled depths)",
    ),
    "dflash": Kind(
        DFlashDraft,
        dflash_forward,
        # blocks at random anchors, drawn per row from its tokens and the epoch (train/trainer.py reseed)
        options=lambda tr: {
            "anchors": tr.max_anchors,
            "anchor_seed": (tr.seed, 0),
            "dpace": tr.dpace_alpha if tr.block_weight == "dpace" else None,
            "truncate": tr.block_lengths == "random",
        },
        chains_only=True,
        draft_forwards=lambda shape: 1,  # one block a round (the context's keys: a projection per token)
        # the blocks' tokens through every layer: max_anchors blocks of ttt_steps + 1 slots per row
        unrolled=lambda tr: anchor_share(tr) * (tr.ttt_steps + 1),
        # each draft's loss on the (B, T) grid, zeros off the kept anchors (train/dflash.py)
        on_grid=lambda tr: float(tr.ttt_steps),
        summary="DFlash: a block of drafts from one non-causal forward (random anchors)",
        sp_splits_heads=False,
        anchor_row=True,
    ),
}


def anchor_share(tr) -> float:
    """DFlash: the share of a row's positions that anchor a block in training (max_anchors of max_length)."""
    return min(tr.max_anchors, tr.max_length) / tr.max_length


def kind_of(cfg: DraftConfig) -> Kind:
    try:
        return KINDS[cfg.kind]
    except KeyError:
        raise ValueError(f"unknown draft kind {cfg.kind!r} (expected one of {', '.join(KINDS)})") from None


def make_draft(cfg: DraftConfig):
    """The draft module of cfg.kind, initialised (under `torch.device("meta")`: shapes only)."""
    return kind_of(cfg).model(cfg)
