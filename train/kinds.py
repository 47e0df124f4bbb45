"""Draft kinds: one module a kind, one registry, the same faces for every kind.

    kind     model (train/)                 training step                      proposal in the loop
    eagle3   Eagle3Draft   train/model.py   ttt_forward   train/ttt.py        a chain / tree of draft forwards
    peagle   PEagleDraft   train/peagle.py  cod_forward   train/peagle.py     K drafts from one forward

The recipe picks one with `draft.kind`; a checkpoint's config says its own (DraftConfig.kind). The serving
loop's proposals (serve/decoding/engine.py) and the export formats (serve/interchange/formats.py) keep
their own per-kind tables, keyed by the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .model import DraftConfig, Eagle3Draft
from .peagle import COD_FLOOR, COD_RATIO, PEagleDraft, cod_forward
from .ttt import ttt_forward


@dataclass(frozen=True)
class Kind:
    model: type[Eagle3Draft]  # built from a DraftConfig
    forward: Callable  # the training unroll: (draft, aux, input_ids, loss_mask, doc_ids, target, steps, ...)
    summary: str


KINDS = {
    "eagle3": Kind(Eagle3Draft, ttt_forward, "EAGLE-3: one draft forward per drafted token (TTT)"),
    "peagle": Kind(PEagleDraft, cod_forward, "P-EAGLE: all K drafts from one forward (COD-sampled depths)"),
}


def kind_of(cfg: DraftConfig) -> Kind:
    try:
        return KINDS[cfg.kind]
    except KeyError:
        raise ValueError(f"unknown draft kind {cfg.kind!r} (expected one of {', '.join(KINDS)})") from None


def make_draft(cfg: DraftConfig) -> Eagle3Draft:
    """The draft module of cfg.kind, initialised (under `torch.device("meta")`: shapes only)."""
    return kind_of(cfg).model(cfg)


__all__ = ["COD_FLOOR", "COD_RATIO", "KINDS", "Kind", "kind_of", "make_draft"]
