"""The `vocab` stage: the draft's reduced vocabulary, the target tokens it generates most.

EAGLE-3 drafts predict over `draft_vocab_size` tokens. The mapping uses the convention
vLLM and SpecForge load:

    d2t (Vd,) int64   draft id i <-> target id i + d2t[i]   (draft ids in ascending target-id order)
    t2d (V,)  bool    t2d[t] is True iff target id t is in the draft vocabulary

    RUN/vocab/vocab.safetensors   d2t, t2d, counts (V,) int64

Counted on the training split only (data/splits.py): the tuning conversations are left out, as training
leaves them out; DONE records the split, and training refuses a vocab counted on another.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from eyas.data.regenerate import capture_order, conversation_of, loss_mask, read_sequences
from eyas.data.splits import held_out_split, split_record
from eyas.data.target import load_target_config, text_config
from eyas.infra.io import atomic_path
from eyas.infra.layout import is_done, mark_done, read_done, require_done, stage_dir
from eyas.recipes.load import check_against_target
from eyas.recipes.schema import Recipe

STAGE = "vocab"


def build_vocab(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """counts (V,) int64 -> d2t (Vd,) int64, t2d (V,) bool.

    Keeps the `draft_vocab_size` most counted target ids (ties: the lower id first); if fewer
    distinct ids were counted, the lowest unused ids fill the rest."""
    V = counts.numel()
    if not 1 <= draft_vocab_size <= V:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in [1, {V}] (the target's vocab size)")
    ranked = torch.sort(-counts.to(torch.int64), stable=True).indices  # by count desc, then id asc
    chosen = torch.sort(ranked[:draft_vocab_size]).values  # (Vd,) target ids, ascending
    d2t = chosen - torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def count_tokens(seqs: list[dict], vocab_size: int) -> torch.Tensor:
    """How often each target id is a generated (loss-masked) token of the regenerated sequences `seqs`.
    -> (V,) int64."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq in seqs:
        ids = torch.tensor(seq["input_ids"], dtype=torch.int64)[
            torch.tensor(loss_mask(seq), dtype=torch.bool)
        ]
        if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(
                f"regen sequence {seq['id']}: token id {int(ids.max())} outside the target's "
                f"vocabulary of {vocab_size}"
            )
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def training_sequences(recipe: Recipe, run_dir: str | Path) -> tuple[list[dict], dict]:
    """The regenerated sequences training learns from: every one less the tuning split's conversations
    (data/splits.py), which the vocab must not have seen either -> (sequences, the split's record)."""
    seqs = read_sequences(run_dir)
    order = capture_order(seqs)
    groups = [conversation_of(seqs[i]) for i in order]
    train_ids = held_out_split(recipe.train, groups)[0]
    return [seqs[order[i]] for i in train_ids], split_record(recipe.train, groups)


def run_vocab(recipe: Recipe, run_dir: str | Path, progress: bool = True) -> dict:
    """The `vocab` stage (needs the `regenerate` stage); reads only the target's config."""
    if is_done(run_dir, STAGE):
        return read_done(run_dir, STAGE)
    require_done(run_dir, "regenerate", STAGE)
    t0 = time.time()
    cfg = text_config(load_target_config(recipe.target.model, recipe.target.trust_remote_code))
    check_against_target(recipe, cfg.num_hidden_layers, cfg.vocab_size)
    seqs, split = training_sequences(recipe, run_dir)
    counts = count_tokens(seqs, cfg.vocab_size)  # (V,): the training split's generated tokens
    d2t, t2d = build_vocab(counts, recipe.vocab.draft_vocab_size)
    with atomic_path(stage_dir(run_dir, STAGE) / "vocab.safetensors") as tmp:
        save_file({"d2t": d2t, "t2d": t2d, "counts": counts}, str(tmp))
    total = int(counts.sum())
    stats = {
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": recipe.vocab.draft_vocab_size,
        "num_tokens": total,
        "num_distinct_tokens": int((counts > 0).sum()),
        "coverage": int(counts[t2d].sum()) / total if total else None,
        "split": split,
        "wall_s": round(time.time() - t0, 3),
    }
    if progress:
        print(
            f"vocab: {stats['draft_vocab_size']} of {cfg.vocab_size} ids cover "
            f"{stats['coverage']:.2%} of {total} generated tokens"
        )
    mark_done(run_dir, STAGE, stats)
    return stats
