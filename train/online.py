"""`capture.mode: online`: the target runs inside training and no hidden state is stored.

The capture stage still runs: it checks the layer ids and that lm_head(final state) reproduces the
target's logits, and writes `capture/index.json` with `"mode": "online"` and no shards (see
`data/capture.py`). Training then reads the regenerated sequences, in the order an offline capture
stores them (by length, stable), so the validation split and the packed rows are the same; for each
micro-batch the target runs over its sequences (each one alone, right-padded, shortest first,
`capture.batch_size` at a time, as capture batches them) and their aux and final states, cast to
`capture.dtype`, go where the packed rows hold them.
The draft trains on what an offline capture would have stored, up to the float differences of
running the target on other batches. Every process (DDP) runs its own copy of the target on its
own micro-batches.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from eyas.data.capture import DTYPES, capture_batch, right_padded
from eyas.data.regenerate import capture_order, loss_mask, read_sequences
from eyas.data.target import HiddenStateTap, load_target, text_config


class RegeneratedSequences(Dataset):
    """The regenerated sequences as training items {"input_ids" (T,) int64, "loss_mask" (T,) float32},
    shortest first (the order of an offline capture); `lengths` as `ShardDataset`'s."""

    def __init__(self, run_dir: str | Path):
        seqs = read_sequences(run_dir)
        order = capture_order(seqs)
        self.items = [(seqs[i]["input_ids"], loss_mask(seqs[i])) for i in order]
        self.lengths = [len(ids) for ids, _ in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, mask = self.items[i]
        return {
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "loss_mask": torch.tensor(mask, dtype=torch.float32),
        }


def row_segments(doc: torch.Tensor, lengths: torch.Tensor) -> list[tuple[int, int, int]]:
    """The sequences of collated (packed) rows.

    doc ids (B, T), valid lengths (B,) -> [(row, start, length)]."""
    segments = []
    for b in range(doc.shape[0]):
        n = int(lengths[b])
        if n:
            starts = [0, *(torch.nonzero(doc[b, 1:n] != doc[b, : n - 1]).flatten() + 1).tolist(), n]
            segments += [(b, s, e - s) for s, e in zip(starts[:-1], starts[1:])]
    return segments


class OnlineTarget:
    """The target with its tap, on this process's device: adds "aux" (B, T, n_aux*H) and "final"
    (B, T, H) to collated batches (`train/packing.collate_rows`) on that device."""

    def __init__(
        self,
        model_name: str,
        dtype: str,
        device: torch.device,
        layer_ids: list[int],
        store_dtype: str,
        batch_size: int,
        trust_remote_code: bool = False,
    ):
        self.model, _ = load_target(model_name, dtype, str(device), trust_remote_code)
        self.tap = HiddenStateTap(self.model, layer_ids, stop_at_final=True)  # no lm_head, no logits
        self.device, self.dtype, self.batch_size = device, DTYPES[store_dtype], batch_size
        self.hidden = text_config(self.model.config).hidden_size

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids, doc, lengths = (
            batch["input_ids"],
            batch["doc_ids"],
            batch["lengths"],
        )  # (B, T), (B, T), (B,) on CPU
        B, T = ids.shape
        segments = row_segments(doc, lengths)  # the sequences of the packed rows: (row, start, length)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        aux = torch.zeros(B, T, len(self.tap.layer_ids) * self.hidden, dtype=self.dtype, device=self.device)
        final = torch.zeros(B, T, self.hidden, dtype=self.dtype, device=self.device)
        # like capture: sequences of similar length together, capture.batch_size at a time, right-padded
        segments.sort(key=lambda x: x[2])
        for c in range(0, len(segments), self.batch_size):
            chunk = segments[c : c + self.batch_size]
            seg_ids, seg_mask = right_padded([ids[b, s : s + n] for b, s, n in chunk])  # (S, L)
            a, f, _ = capture_batch(self.model, self.tap, seg_ids.to(self.device), seg_mask.to(self.device))
            for i, (b, s, n) in enumerate(chunk):  # (S, L, n_aux*H), (S, L, H) -> the packed rows
                aux[b, s : s + n] = a[i, :n].to(self.dtype)
                final[b, s : s + n] = f[i, :n].to(self.dtype)
            self.tap.clear()  # the tap must not hold them through training
        batch["aux"], batch["final"] = aux, final
        return batch
