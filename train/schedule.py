"""Which rows each process trains on, and when: epochs, global batches, ranks.

Per epoch the rows are shuffled by (seed, epoch) alone, so every process and every resume sees
the same order. The order is cut into global micro-batches of `batch_size` rows; micro-batch m
goes to rank m mod world. An optimizer step takes `grad_accum` micro-batches on every rank, so
one step consumes world x grad_accum x batch_size rows (the global batch), and each row is
trained on once per epoch across all ranks.

When the micro-batches do not divide evenly, a rank's list is padded with empty micro-batches
(trained as a row with no loss-counted position: zero loss, zero gradient), so every rank takes
the same number of steps and collective calls never wait on a rank that ran out of data.

This makes N processes x grad_accum a equal to one process x grad_accum N*a: the same rows in the
same optimizer steps (tests/test_distributed.py).
"""

from __future__ import annotations

import math

import torch


def updates_per_epoch(num_rows: int, batch_size: int, grad_accum: int, world: int) -> int:
    return max(1, math.ceil(math.ceil(num_rows / batch_size) / (world * grad_accum)))


def epoch_micro_batches(
    num_rows: int, batch_size: int, grad_accum: int, world: int, rank: int, seed: int, epoch: int
) -> list[list[int]]:
    """This rank's micro-batches for `epoch`: lists of row indices ([] = an empty filler)."""
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed * 100003 + epoch)).tolist()
    return deal(
        order,
        batch_size,
        world,
        rank,
        updates_per_epoch(num_rows, batch_size, grad_accum, world) * grad_accum,
    )


def evaluation_micro_batches(num_rows: int, batch_size: int, world: int, rank: int) -> list[list[int]]:
    """This rank's share of rows 0..num_rows-1 in order, one pass (validation), padded like training's."""
    return deal(
        list(range(num_rows)), batch_size, world, rank, math.ceil(math.ceil(num_rows / batch_size) / world)
    )


def deal(order: list[int], batch_size: int, world: int, rank: int, per_rank: int) -> list[list[int]]:
    """Global micro-batch g = order[g*b:(g+1)*b] goes to rank g mod world; `per_rank` of them each."""
    return [order[g * batch_size : (g + 1) * batch_size] for g in range(rank, per_rank * world, world)]


class MicroBatches(torch.utils.data.Dataset):
    """Item i = micro-batch i collated (`collate(list of rows)`); an empty micro-batch is row 0 with
    its loss mask zeroed, so the step runs and contributes nothing."""

    def __init__(self, rows, batches: list[list[int]], collate):
        self.rows, self.batches, self.collate = rows, batches, collate

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.batches[i]:
            return self.collate([self.rows[r] for r in self.batches[i]])
        batch = self.collate([self.rows[0]])
        batch["loss_mask"] = torch.zeros_like(batch["loss_mask"])
        batch["lengths"] = torch.zeros_like(batch["lengths"])  # trains no token
        return batch
