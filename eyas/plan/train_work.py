"""Draft training in FLOPs: what `eyas plan --run` prices training by, so that a rate measured over a small
run's rows holds for another run's.

    a token trained     unrolled steps x 6 x the draft's weights but its embedding (forward 2, backward 4; the
                        fc over the aux states counted at every step: an upper bound)
                        + the teacher's lm_head over the target's vocabulary, 2 x V x H (forward; teacher
                        final)
    a (query, key) pair unrolled steps x layers x 12 x heads x head_dim (forward 4, backward 8), causal within
                        one sequence (packing keeps attention within a sequence: train/attention.py)

Why: the SmolLM2 long-context recipe's 64-conversation run trained its 8 steps over rows of 593 pairs a token
at 170 tok/s; the whole run's 400 steps held 1,473 pairs a token and ran at 154 tok/s (the 2-core AVX2 EPYC).
Per token the plan from the small run missed by -10%; in these FLOPs by -1.2% (78.2 against 79.2 min).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from eyas.data.shards import ShardDataset
from eyas.data.splits import held_out_split, run_groups
from eyas.infra.layout import RECIPE
from eyas.plan.flops import causal_pairs
from eyas.recipes.load import load_recipe
from eyas.train.kinds import kind_named
from eyas.train.packing import plan_rows
from eyas.train.schedule import epoch_micro_batches

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from eyas.plan.cost import DraftCount
    from eyas.recipes.schema import Recipe


@dataclass
class TrainCost:
    """What a training step costs the draft: a token, a (query, key) pair within a sequence."""

    per_token: float
    per_pair: float


def train_cost(recipe: Recipe, draft: DraftCount, cfg: PretrainedConfig, unrolled: float) -> TrainCost:
    """The draft's TrainCost over `unrolled` steps a row (cost.py unrolled_steps)."""
    dc = draft.config
    weights = draft.trainable + draft.frozen - dc.vocab_size * dc.hidden_size  # the embedding: a lookup
    teacher = 2 * dc.vocab_size * dc.target_hidden_size if recipe.capture.teacher == "final" else 0
    return TrainCost(
        per_token=unrolled * 6 * weights + teacher,
        per_pair=unrolled * dc.num_layers * 12 * dc.num_attention_heads * dc.head_dim,
    )


def causal_pairs_per_token(lengths, max_length: int) -> float:
    """(query, key) pairs a token of sequences of `lengths` tokens, each cut to `max_length`."""
    ls = np.minimum(np.asarray(lengths, dtype=np.float64), max_length)
    return float(causal_pairs(ls, None).sum() / ls.sum()) if ls.sum() else 0.0


def trained_pairs(
    recipe: Recipe, run_dir: str | Path, steps: int, processes: int
) -> tuple[int, float] | None:
    """The (tokens, causal pairs) --run's training went through in its `steps` optimizer steps on
    `processes` processes: its rows (train/packing.py) in its epochs' order (train/schedule.py), as its own
    recipe.yaml set them. None where its rate cannot be carried in these FLOPs: no offline capture to read
    its lengths from, a draft kind whose training is not priced so (DraftKind.flops_priced_training),
    or another draft or TTT than `recipe`'s."""
    run = Path(run_dir)
    if not (run / "capture" / "index.json").is_file() or not (run / RECIPE).is_file():
        return None
    ran = load_recipe(run / RECIPE)
    tr = ran.train
    same = ran.draft == recipe.draft and tr.ttt_steps == recipe.train.ttt_steps
    if not same or not kind_named(recipe.draft.kind).flops_priced_training:
        return None
    processes //= tr.sequence_parallel  # the data-parallel ranks: a row's shards share its micro-batch
    seqs = ShardDataset(run / "capture")
    ids, _ = held_out_split(tr, run_groups(run, len(seqs)))
    lengths = [min(seqs.lengths[i], tr.max_length) for i in ids]
    rows = plan_rows(lengths, tr.max_length, tr.pack, tr.seed, tr.pack_length)
    left, tokens, pairs, epoch = steps * processes * tr.grad_accum, 0, 0.0, 0
    while left > 0:  # the global micro-batches of each epoch, in order, until the steps run out
        order = epoch_micro_batches(len(rows), tr.batch_size, tr.grad_accum * processes, 1, 0, tr.seed, epoch)
        for batch in order[:left]:
            seq = np.array([lengths[i] for r in batch for i in rows[r]], dtype=np.float64)
            tokens, pairs = tokens + int(seq.sum()), pairs + float(causal_pairs(seq, None).sum())
        left, epoch = left - len(order), epoch + 1
    return tokens, pairs
