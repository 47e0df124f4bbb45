"""What the draft kinds' training unrolls share (train/kinds/): their signature (`Unroll`), the (B, T) grid a
kind's kept anchors scatter to and gather from, and the seeds that draw a row's anchors.

    kept anchors  flat (N,) = b * T + i       one entry per kept (row b, position i)
    to_grid       (1, N, ...) -> (B, T, ...)  zeros off the anchors (the loss and the counts read the grid)
    from_grid     (B, T, ...) -> (1, N, ...)  to_grid's inverse at the anchors
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:  # annotations only (train/ttt.py imports this module)
    from .sequence_parallel import SequenceParallel
    from .ttt import TargetView, TTTOutput


class Unroll(Protocol):
    """A kind's training unroll (DraftKind.forward: its core.py UNROLL): one right-padded (optionally packed)
    batch through the draft as the kind trains, scored as TTT's steps. Seven inputs by position, then the
    training settings every kind takes by name, then the kind's own options (DraftKind.options: P-EAGLE's
    COD, DFlash's anchors); tests/test_kind_homes.py holds each kind's function to it.

        draft       the kind's model (DraftKind.model)
        aux         (B, T, n_aux * H_t) the target's aux states (a shard of them under `sp`)
        input_ids   (B, T) long; loss_mask (B, T); doc_ids (B, T) each position's sequence (train/packing.py)
        target      the teacher (train/ttt.py TargetView), None: no loss (logits only); computed only at
                    the kind's rows (DraftKind.rows, its core's ROWS; teacher_rows: a counted x_q may read
                    z_{q-steps} .. z_{q-1}; DFlash's drawn blocks' own), no other
        steps       drafts a position trains: TTT steps, P-EAGLE depths, DFlash's block - 1
    """

    def __call__(
        self,
        draft: Any,
        aux: torch.Tensor,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        doc_ids: torch.Tensor,
        target: TargetView | None,
        steps: int,
        /,
        decay: float = 0.8,
        attention: str = "auto",
        keep_logits: bool = False,
        checkpoint_layer: bool = False,
        loss: str = "kl",
        sampled_text: bool = False,
        sp: SequenceParallel | None = None,
        **options: Any,
    ) -> TTTOutput: ...


def row_seeds(seed: tuple[int, ...], input_ids: torch.Tensor, counted: torch.Tensor) -> list[int]:
    """One seed per row from `seed` (train.seed, the epoch) and the row's own counted tokens: the same row
    draws the same anchors in one process or many, and other ones the next epoch."""
    out = []
    for b in range(input_ids.shape[0]):
        tokens = input_ids[b][counted[b]].cpu().numpy().tobytes()
        out.append(zlib.crc32(tokens, zlib.crc32(repr(tuple(seed)).encode())))
    return out


def shift_right(t: torch.Tensor, s: int) -> torch.Tensor:
    """(B, T) bool t moved s places right along dim 1, False filling the left: out[:, p] = t[:, p - s]."""
    return torch.cat([torch.zeros_like(t[:, :s]), t[:, : t.shape[1] - s]], dim=1)


def to_grid(x: torch.Tensor, flat: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """(1, N, ...) at the anchors `flat` -> (B, T, ...), zeros elsewhere."""
    grid = x.new_zeros(B * T, *x.shape[2:]).index_copy(0, flat, x[0])
    return grid.view(B, T, *x.shape[2:])


def from_grid(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) -> (1, N, ...) at the anchors `flat` (to_grid's inverse there)."""
    return x.reshape(-1, *x.shape[2:])[flat][None]
