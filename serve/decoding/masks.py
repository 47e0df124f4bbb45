"""Which cache slots each new entry may attend to, for ragged rows, chains and trees.

A forward appends q new entries to each of n rows (cache.py). Row b holds:

    slots 0 .. C_b-1        committed entries; slot j is position j
    spec_slots[b, :P]       speculative entries written by earlier forwards of this iteration
                            (the draft's tree levels so far)
    spec_slots[b, P:]       the q new entries (their write slots)

New entry i of row b may see
    * every committed slot, and
    * speculative / new entry e where vis[b, i, e] (its tree ancestors and itself; a padding
      entry sees only itself, so no query row is empty),
and on a sliding-window layer only keys whose position p_k satisfies p_k > p_q - window,
which is Hugging Face's `sliding_window_overlay` (and vLLM's window) written with positions.

Ragged appends are left-padded: row b's `lengths[b]` real entries are the LAST of the q, so
the last index of every row is a real token (`logits_to_keep=1` picks it for every row).
"""

from __future__ import annotations

import torch

from eyas.train.blocked_attention import NAME as BLOCKED


def left_padded_slots(committed: torch.Tensor, lengths: torch.Tensor, q: int) -> torch.Tensor:
    """Write slots (n, q) for a left-padded append: row b's real entry j (j < lengths[b]) goes to
    slot committed[b] + j, its padding entries to the distinct slots after them."""
    i = torch.arange(q, device=committed.device)[None]
    pad = (q - lengths)[:, None]  # (n, 1) leading padding entries
    real = committed[:, None] + i - pad
    junk = committed[:, None] + lengths[:, None] + i
    return torch.where(i >= pad, real, junk)


def causal_vis(lengths: torch.Tensor, q: int) -> torch.Tensor:
    """vis (n, q, q) for left-padded causal appends: real entries see earlier real entries and
    themselves; padding entries see themselves only."""
    i = torch.arange(q, device=lengths.device)
    pad = (q - lengths)[:, None, None]
    real_q, real_k = i[None, :, None] >= pad, i[None, None, :] >= pad
    causal = i[None, :, None] >= i[None, None, :]
    return (real_q & real_k & causal) | torch.eye(q, dtype=torch.bool, device=lengths.device)[None]


def attention_allowed(
    committed: torch.Tensor,
    spec_slots: torch.Tensor,
    spec_pos: torch.Tensor,
    vis: torch.Tensor,
    kv_len: int,
    window: int | None = None,
) -> torch.Tensor:
    """committed (n,); spec_slots, spec_pos (n, P+q); vis (n, q, P+q) -> allowed (n, q, kv_len) bool."""
    n, q, e = vis.shape
    dev = vis.device
    slots = torch.arange(kv_len, device=dev)
    allowed = (slots[None, :] < committed[:, None])[:, None, :].expand(n, q, kv_len).clone()
    allowed.scatter_(2, spec_slots[:, None, :].expand(n, q, e), vis)
    if window is not None:
        key_pos = slots[None, :].expand(n, kv_len).clone().scatter_(1, spec_slots, spec_pos)
        query_pos = spec_pos[:, e - q :]
        allowed &= key_pos[:, None, :] > query_pos[:, :, None] - window
    return allowed


def as_attention_mask(allowed: torch.Tensor, impl: str, dtype: torch.dtype) -> torch.Tensor:
    """(n, q, K) bool -> the 4D mask the attention implementation takes: sdpa and eyas_blocked
    (train/blocked_attention.py) a bool mask, eager an additive float mask (0 / dtype min, as transformers'
    `eager_mask`)."""
    m = allowed[:, None]
    if impl in ("sdpa", BLOCKED):
        return m
    return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, torch.finfo(dtype).min)


def target_masks(config, allowed_full: torch.Tensor, allowed_window: torch.Tensor | None, dtype: torch.dtype):
    """The `attention_mask` argument for a Hugging Face causal LM: a dict per layer type for models
    with several (gpt-oss: full and sliding), else one 4D mask (window applied when the model has one)."""
    impl = config._attn_implementation
    types = set(getattr(config, "layer_types", None) or [])
    if "sliding_attention" in types and len(types) > 1:
        allowed_window = allowed_full if allowed_window is None else allowed_window
        return {
            "full_attention": as_attention_mask(allowed_full, impl, dtype),
            "sliding_attention": as_attention_mask(allowed_window, impl, dtype),
        }
    return as_attention_mask(allowed_window if allowed_window is not None else allowed_full, impl, dtype)


def model_window(config) -> int | None:
    """The sliding window the target's masks need, or None (no sliding-window layer)."""
    types = set(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    if types:
        unknown = types - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(
                f"the speculative loop supports full and sliding-window attention layers, "
                f"not {sorted(unknown)}"
            )
        return window if "sliding_attention" in types else None
    return window
