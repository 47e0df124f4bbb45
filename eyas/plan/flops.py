"""The target's forward in FLOPs, as capture runs it: what `eyas plan` prices capture by, so that a rate
measured over one run's sequence lengths holds for another's.

    a sequence of L tokens, in a batch padded to T (hf) or alone (vllm):

    linear   2 x (the weights a token multiplies) x tokens run        embedding and lm_head apart:
                                                                      capture stops at the lm_head input
    attention, per layer   4 x (heads x head_dim) x (query, key) pairs   Q K^T and the weights times V
             hf:   T x T pairs a row of the padded batch (SDPA with a padding mask computes every one;
                   a sliding window's mask too)
             vllm: the causal pairs within the window (flash kernels skip the masked blocks)

Why: a run's tokens/s is no rate for another run. Capture batches `capture.batch_size` sequences sorted by
length (data/regenerate.py capture_order) and pads each batch to its longest: a 64-conversation run of the
SmolLM2 long-context recipe padded 1.343 tokens a token, the full run 1.031; and attention grows with the
square of the length (gpt-oss-120b through vLLM: 3% of the FLOPs at 2K tokens, 35% at 32K, half at about
64K: its 18 full-attention layers against the 4.6B weights a token multiplies, embedding and lm_head apart). In FLOPs the two runs' capture rates agreed within 3% (59.5 and 61.1 GFLOP/s,
this module's count, on a 2-core AVX2 EPYC).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from eyas.data.target import text_config

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from eyas.data.target import TargetCount


@dataclass
class ForwardCost:
    """What one token and one (query, key) pair cost in the target's forward."""

    linear: float  # FLOPs a token: 2 x the weights it multiplies (MoE: its experts' share), lm_head apart
    widths: list[int]  # per layer: heads x head_dim (the width of Q K^T and of the weighted sum of V)
    windows: list[int | None]  # per layer: its sliding window, None for full attention


@dataclass
class CaptureWork:
    """A capture's forwards over the planned sequences."""

    tokens: float  # the sequences' tokens
    run_tokens: float  # the tokens the forwards run: the padding of hf's batches included
    flops: float  # linear and attention
    attention: float  # of them


def forward_cost(cfg: PretrainedConfig, target: TargetCount) -> ForwardCost:
    """The target's ForwardCost from its config and its counted parameters (`count_target`)."""
    c = text_config(cfg)
    experts_per_token = getattr(c, "num_experts_per_tok", 1) / max(getattr(c, "num_local_experts", 1), 1)
    embeddings = c.vocab_size * c.hidden_size * (1 if getattr(c, "tie_word_embeddings", False) else 2)
    dense = target.params - target.expert_params - embeddings
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    window = getattr(c, "sliding_window", None)
    return ForwardCost(
        linear=2 * (dense + target.expert_params * experts_per_token),
        widths=[c.num_attention_heads * head_dim] * c.num_hidden_layers,
        windows=[window if t == "sliding_attention" else None for t in types],
    )


def causal_pairs(n: np.ndarray, window: int | None) -> np.ndarray:
    """(query, key) pairs of a causal mask over `n` tokens (each), a query seeing at most `window` keys."""
    if window is None:
        return n * (n + 1) / 2
    w = np.minimum(n, window)
    return w * (w + 1) / 2 + (n - w) * window


def forward_flops(cost: ForwardCost, lengths, batch_size: int, padded: bool) -> tuple[float, float]:
    """FLOPs of capture's forwards over sequences of `lengths` tokens -> (linear, attention).

    padded (capture.backend hf): sorted shortest first, `batch_size` at a time, each batch right-padded to
    its longest (data/capture.py); otherwise (vllm) each sequence alone, causal."""
    ls = np.sort(np.asarray(lengths, dtype=np.float64))
    if not len(ls):
        return 0.0, 0.0
    if padded:  # every row of a batch runs its batch's longest, over every pair of it
        starts = np.arange(0, len(ls), batch_size)
        longest, rows = np.maximum.reduceat(ls, starts), np.diff(np.append(starts, len(ls)))
        pairs = float((rows * longest**2).sum())
        return cost.linear * float((rows * longest).sum()), 4 * sum(cost.widths) * pairs
    attention = sum(4 * w * float(causal_pairs(ls, win).sum()) for w, win in zip(cost.widths, cost.windows))
    return cost.linear * float(ls.sum()), attention
