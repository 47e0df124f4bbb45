"""The target's forward in FLOPs, as capture runs it: what `eyas plan` prices capture by, so that a rate
measured over one run's sequence lengths holds for another's.

    sequences sorted by length (data/regenerate.py capture_order), `capture.batch_size` at a time;
    a batch's rows right-padded to its longest, T (hf), or each sequence alone (vllm)

    linear     2 x (the weights a token multiplies) x the tokens run     embedding and lm_head apart (capture
                                                                         stops at the lm_head's input; a
                                                                         top-k teacher runs the lm_head too)
    attention  4 x (heads x head_dim) x (query, key) pairs, per layer    Q K^T, and the weights times V
               hf, a padded batch:  T x T pairs a row (SDPA or eager attention with a padding mask
                                    computes every one; a sliding window's mask too)
               hf, no padding, and vllm:  the causal pairs within the window (the kernels skip the
                                    masked blocks)

    shards (`--shard I/N`, torchrun, vLLM replicas): contiguous runs of the batches of about equal tokens
    (data/sharding.py balanced_ranges), so the shard of the longest sequences runs the most FLOPs

Why: a run's tokens/s is no rate for another run. Sorted batches of 73 sequences (a 64-conversation run of
the SmolLM2 long-context recipe) padded 1.343 tokens a token, the full run's 621 1.031; and attention grows
with the square of the length (gpt-oss-120b through vLLM: 3% of the FLOPs at 2K tokens, 35% at 32K, half at
about 64K: its 18 full-attention layers against the 4.6B weights a token multiplies). In FLOPs the two runs'
capture rates came within 9% (55.6 and 60.4 GFLOP/s on a 2-core AVX2 EPYC; per token 82 and 138 tok/s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from eyas.data.sharding import balanced_ranges
from eyas.data.target import text_config
from eyas.plan.eval_memory import head_dim

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from eyas.data.target import TargetCount
    from eyas.recipes.schema import CaptureSection


@dataclass
class ForwardCost:
    """What capture's forward costs: a token, a (query, key) pair; how it batches."""

    linear: float  # FLOPs a token: 2 x the weights it multiplies (MoE: its experts' share)
    widths: list[int]  # per layer: heads x head_dim (the width of Q K^T and of the weighted sum of V)
    windows: list[int | None]  # per layer: its sliding window, None for full attention
    batch_size: int  # capture.batch_size
    padded: bool  # capture.backend hf: a batch's rows padded to its longest; vllm: each sequence alone


@dataclass
class CaptureWork:
    """A capture's forwards over a run's sequences."""

    tokens: float  # the sequences' tokens
    run_tokens: float  # the tokens the forwards run: hf's padding included
    flops: float  # linear and attention
    attention: float  # of them
    shard_tokens: list[float]  # per shard (balanced_ranges over the batches' tokens)
    shard_flops: list[float]


def forward_cost(cfg: PretrainedConfig, target: TargetCount, c: CaptureSection) -> ForwardCost:
    """The target's ForwardCost (`count_target`'s parameters) as capture section `c` runs it."""
    t = text_config(cfg)
    experts_per_token = getattr(t, "num_experts_per_tok", 1) / max(getattr(t, "num_local_experts", 1), 1)
    tied = getattr(t, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False))
    embeddings = t.vocab_size * t.hidden_size * (1 if tied else 2)
    lm_head = t.vocab_size * t.hidden_size if c.teacher == "topk" else 0  # stored_form's top-k logits
    dense = target.params - target.expert_params - embeddings + lm_head
    types = getattr(t, "layer_types", None) or ["full_attention"] * t.num_hidden_layers
    window = getattr(t, "sliding_window", None)
    return ForwardCost(
        linear=2 * (dense + target.expert_params * experts_per_token),
        widths=[t.num_attention_heads * head_dim(t)] * t.num_hidden_layers,
        windows=[window if kind == "sliding_attention" else None for kind in types],
        batch_size=c.batch_size,
        padded=c.backend == "hf",
    )


def causal_pairs(n: np.ndarray, window: int | None) -> np.ndarray:
    """(query, key) pairs of a causal mask over `n` tokens (each), a query seeing at most `window` keys."""
    if window is None:
        return n * (n + 1) / 2
    w = np.minimum(n, window)
    return w * (w + 1) / 2 + (n - w) * window


def capture_work(cost: ForwardCost, lengths, shards: int = 1) -> CaptureWork:
    """Capture's forwards over sequences of `lengths` tokens, in `shards` shards."""
    ls = np.sort(np.asarray(lengths, dtype=np.float64))
    starts = np.arange(0, len(ls), cost.batch_size)
    if not len(ls):
        return CaptureWork(0.0, 0.0, 0.0, 0.0, [0.0] * shards, [0.0] * shards)
    batch = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(ls))))  # each sequence's batch
    longest = np.maximum.reduceat(ls, starts)[batch]
    padded = cost.padded & (np.minimum.reduceat(ls, starts) < np.maximum.reduceat(ls, starts))[batch]
    run = np.where(padded, longest, ls)  # the tokens each row runs
    causal = sum(w * causal_pairs(ls, win) for w, win in zip(cost.widths, cost.windows))
    attention = 4 * np.where(padded, sum(cost.widths) * longest**2, causal)
    flops = cost.linear * run + attention  # each sequence's
    tokens, per_batch = np.bincount(batch, ls), np.bincount(batch, flops)
    ranges = balanced_ranges(tokens.tolist(), shards)
    return CaptureWork(
        tokens=float(ls.sum()),
        run_tokens=float(run.sum()),
        flops=float(flops.sum()),
        attention=float(attention.sum()),
        shard_tokens=[float(tokens[a:b].sum()) for a, b in ranges],
        shard_flops=[float(per_batch[a:b].sum()) for a, b in ranges],
    )


def measured_flop_s(work: CaptureWork, tokens_per_s: float) -> float:
    """A shard's FLOP/s from a run's capture: the stage's tokens/s is its shards' summed, shard i's tokens
    over its time F_i / R at the rate R each runs -> R = tokens_per_s / sum(tokens_i / F_i)."""
    per_flop = sum(t / f for t, f in zip(work.shard_tokens, work.shard_flops) if f)
    return tokens_per_s / per_flop if per_flop else 0.0
