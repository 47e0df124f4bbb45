"""Sequence packing: several captured sequences side by side in one training row.

A row is a list of sequence indices whose lengths (each cut to `max_length`) add up to at most
`max_length`. Inside a row every position carries a document id (0, 1, … in order; padding gets
the next id, so ids never decrease along a row). TTT reads them to

    * restrict step-0 attention to the same document (`train/attention.py`),
    * restart RoPE positions at 0 for each sequence (`positions_in_doc`),
    * count a prediction only when the token it predicts is in the same sequence.

Without packing each row holds one sequence, and the same code runs with two ids (0 and padding).
"""

from __future__ import annotations

import bisect

import torch


def plan_rows(
    lengths: list[int], max_length: int, pack: bool, seed: int = 0, pack_length: int | None = None
) -> list[list[int]]:
    """Rows of sequence indices. pack=False: one sequence per row, in order. pack=True: best-fit
    decreasing over a seeded order (equal lengths keep the shuffle), so a row wastes little and the
    plan is the same on every process and every resume; rows are filled up to `pack_length` tokens
    (None: max_length), and a sequence longer than that (cut to max_length) is a row of its own."""
    if not pack:
        return [[i] for i in range(len(lengths))]
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=g).tolist()
    order.sort(key=lambda i: -min(lengths[i], max_length))  # stable sort
    rows: list[list[int]] = []
    free: list[
        tuple[int, int]
    ] = []  # (room left, row), sorted: the tightest row that fits is found by bisect
    for i in order:
        n = min(lengths[i], max_length)
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            room, r = free.pop(at)
            rows[r].append(i)
        else:
            room, r = max(pack_length or max_length, n), len(rows)
            rows.append([i])
        if room - n > 0:
            bisect.insort(free, (room - n, r))
    return rows


def cut_note(lengths: list[int], max_length: int) -> str | None:
    """The log's line when some sequences are longer than a row (training cuts them to `max_length` tokens and
    never sees their tails), else None."""
    long = [n for n in lengths if n > max_length]
    if not long:
        return None
    return (
        f"{len(long)} of {len(lengths)} training sequences are longer than train.max_length={max_length} "
        f"(the longest {max(long)} tokens): each is cut to {max_length}; raise train.max_length to train on "
        "their tails"
    )


class PackedRows(torch.utils.data.Dataset):
    """Rows of a `ShardDataset` per a plan -> lists of its items (one per packed sequence)."""

    def __init__(self, sequences, rows: list[list[int]]):
        self.sequences, self.rows = sequences, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, r: int) -> list[dict[str, torch.Tensor]]:
        return [self.sequences[i] for i in self.rows[r]]


def collate_rows(rows: list[list[dict[str, torch.Tensor]]], max_length: int) -> dict[str, torch.Tensor]:
    """Concatenate each row's sequences (each cut to `max_length`, the row too), right-pad rows.

    -> aux (B, T, n_aux*H), the teacher (final (B, T, H), or teacher_ids and teacher_logprobs (B, T, k)),
    input_ids (B, T) int64, loss_mask (B, T) float32 (0 on padding), doc_ids (B, T) int64,
    lengths (B,) int64 valid tokens per row."""
    per_token = list(rows[0][0])  # the items' keys: every tensor is per token
    joined = []
    for row in rows:
        parts = {k: [] for k in (*per_token, "doc_ids")}
        used = 0
        for d, seq in enumerate(row):
            n = min(len(seq["input_ids"]), max_length - used)
            if n <= 0:
                break
            for k in per_token:
                parts[k].append(seq[k][:n])
            parts["doc_ids"].append(torch.full((n,), d, dtype=torch.int64))
            used += n
        joined.append({k: torch.cat(v) for k, v in parts.items()})
    lengths = torch.tensor([len(x["input_ids"]) for x in joined], dtype=torch.int64)
    T = int(lengths.max())
    out = {}
    for key in (*per_token, "doc_ids"):
        first = joined[0][key]
        padded = first.new_zeros((len(joined), T) + tuple(first.shape[1:]))
        for b, x in enumerate(joined):
            padded[b, : lengths[b]] = x[key]
            if key == "doc_ids":
                padded[b, lengths[b] :] = int(x[key][-1]) + 1  # padding: a document of its own, last
        out[key] = padded
    out["lengths"] = lengths
    return out


def doc_ids_from_lengths(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """One sequence per row, right-padded: (B,) valid lengths -> doc ids (B, T): 0, then 1 on padding."""
    idx = torch.arange(T, device=lengths.device)
    return (idx[None, :] >= lengths[:, None]).long()


def positions_in_doc(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) doc ids -> (B, T) position of each token inside its own sequence (RoPE restarts)."""
    B, T = doc_ids.shape
    idx = torch.arange(T, device=doc_ids.device).expand(B, T)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values  # start of each token's doc
    return idx - first
