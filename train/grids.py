"""What the draft kinds' training unrolls share (train/kinds/): the (B, T) grid a kind's kept anchors
scatter to and gather from, and the seeds that draw a row's anchors.

    kept anchors  flat (N,) = b * T + i       one entry per kept (row b, position i)
    to_grid       (1, N, ...) -> (B, T, ...)  zeros off the anchors (the loss and the counts read the grid)
    from_grid     (B, T, ...) -> (1, N, ...)  to_grid's inverse at the anchors
"""

from __future__ import annotations

import zlib

import torch


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
