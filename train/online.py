"""`capture.mode: online`: the target runs inside training and no hidden state is stored.

The capture stage still runs: it checks the layer ids and that lm_head(final state) reproduces the
target's logits, and writes `capture/index.json` with `"mode": "online"` and no shards (see
`data/capture.py`). Training then reads the regenerated sequences, in the order an offline capture
stores them (by length, stable), so the validation split and the packed rows are the same; for each
micro-batch the target runs over its sequences (each one alone, right-padded, as capture batches
them) and their aux and final states, cast to `capture.dtype`, go where the packed rows hold them.
The draft trains on what an offline capture would have stored, up to the float differences of
running the target on other batches. Every process (DDP) runs its own copy of the target on its
own micro-batches.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from eyas.data.capture import DTYPES, capture_batch
from eyas.data.regenerate import loss_mask, read_sequences
from eyas.data.target import HiddenStateTap, load_target


class RegeneratedSequences(Dataset):
    """The regenerated sequences as training items {"input_ids" (T,) int64, "loss_mask" (T,) float32},
    shortest first (the order of an offline capture); `lengths` as `ShardDataset`'s."""

    def __init__(self, run_dir: str | Path):
        seqs = read_sequences(run_dir)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["input_ids"]))  # as data/capture.py
        self.items = [(seqs[i]["input_ids"], loss_mask(seqs[i])) for i in order]
        self.lengths = [len(ids) for ids, _ in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, mask = self.items[i]
        return {"input_ids": torch.tensor(ids, dtype=torch.int64), "loss_mask": torch.tensor(mask, dtype=torch.float32)}


class OnlineTarget:
    """The target with its tap, on this process's device: adds "aux" (B, T, n_aux*H) and "final"
    (B, T, H) to collated batches (`train/packing.collate_rows`) on that device."""

    def __init__(self, model_name: str, dtype: str, device: torch.device, layer_ids: list[int], store_dtype: str,
                 trust_remote_code: bool = False):
        self.model, _ = load_target(model_name, dtype, str(device), trust_remote_code)
        self.tap = HiddenStateTap(self.model, layer_ids, stop_at_final=True)  # no lm_head, no logits
        self.device, self.dtype = device, DTYPES[store_dtype]

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = {k: v.to(self.device) for k, v in batch.items()}
        ids, doc, lengths = batch["input_ids"], batch["doc_ids"], batch["lengths"]  # (B, T), (B, T), (B,)
        B, T = ids.shape
        # the sequences of the packed rows: (row, start, length)
        segments = []
        for b in range(B):
            n = int(lengths[b])
            if n == 0:
                continue
            starts = [0] + [t for t in range(1, n) if int(doc[b, t]) != int(doc[b, t - 1])] + [n]
            segments += [(b, s, e - s) for s, e in zip(starts[:-1], starts[1:])]
        if not segments:  # an empty filler micro-batch (train/schedule.py): zeros of the right shapes
            H = self.model.config.get_text_config().hidden_size
            batch["aux"] = torch.zeros(B, T, len(self.tap.layer_ids) * H, dtype=self.dtype, device=self.device)
            batch["final"] = torch.zeros(B, T, H, dtype=self.dtype, device=self.device)
            return batch
        L = max(n for _, _, n in segments)
        seg_ids = torch.zeros(len(segments), L, dtype=torch.long, device=self.device)  # right padded, as capture
        seg_mask = torch.zeros_like(seg_ids)
        for i, (b, s, n) in enumerate(segments):
            seg_ids[i, :n], seg_mask[i, :n] = ids[b, s:s + n], 1
        aux, final, _ = capture_batch(self.model, self.tap, seg_ids, seg_mask)  # (S, L, n_aux*H), (S, L, H)
        batch["aux"] = aux.new_zeros(B, T, aux.shape[-1], dtype=self.dtype)
        batch["final"] = final.new_zeros(B, T, final.shape[-1], dtype=self.dtype)
        for i, (b, s, n) in enumerate(segments):
            batch["aux"][b, s:s + n] = aux[i, :n].to(self.dtype)
            batch["final"][b, s:s + n] = final[i, :n].to(self.dtype)
        return batch
