"""The target's attention in the serving loop, in query blocks: eager attention's exact math, sinks and
sliding windows included, without a (heads x q x kv) score tensor for the whole forward.

gpt-oss takes no SDPA in transformers (its sinks: a learned logit per head in every softmax's denominator),
so its eager attention materialises (batch, heads, q, kv) scores: for a 128K-token prompt in one forward,
64 heads x 128K x 128K x 2 bytes = 2.2 TB. Here each block of query rows computes its scores over the keys
it may see, then the next block:

    query (B, H, q, d) ──► rows s..e (the block: budget_bytes // (4 x B x H x kv x element bytes) rows)
                              │ its mask rows (B, 1, e-s, kv) bool; the key range lo..hi any of them sees
                              │ (a sliding layer's window, a causal block's past: the rest is never read)
                              ▼
                 scores = q_blk @ k[lo:hi]ᵀ x scaling      (B, H_kv, groups x rows, hi-lo): query heads
                              │ masked: dtype min            grouped over their KV head, no repeat_kv copy
                              │ [‖ sinks]  - max  softmax  [drop the sink column]      (as eager does it)
                              ▼
                 out[:, s:e] = probs @ v[lo:hi]               (B, e-s, H, d)

Each row's numbers are those of transformers' eager attention (gpt-oss's `eager_attention_forward`, with
sinks; Llama's, without: fp32 softmax): the same scores, the masked keys at the dtype's minimum (their
weights underflow to exactly 0 either way), the same softmax. Where a block reads every key the result is
eager's bitwise; where it reads a range (a sliding layer's window, a causal block's past, on multiples of
ALIGN) the sums over keys run in another order: within 2e-7 in fp32 (`tests/test_chunked_prefill.py`).

Registered with transformers as the attention implementation "eyas_blocked" (and sdpa's bool masks for it:
`use_blocked_attention`); the engine (serve/decoding/engine.py), the greedy reference (reference.py there) and
the verdict use it for every target whose own implementation is not SDPA; the draft (train/model.py) for
grouped KV heads on CUDA. Memory per forward: the block's scores, about
`budget_bytes` (BLOCK_BYTES unless set), whatever the prompt's length.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from eyas.recipes.defaults import ATTENTION_BLOCK_MB

NAME = "eyas_blocked"
BLOCK_BYTES = ATTENTION_BLOCK_MB << 20  # the score tensors of one query block (eval.attention_block_mb)
_budget = {"bytes": BLOCK_BYTES}


def blocked_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (s_aux: gpt-oss's sinks) -> (attend_in_blocks's output,
    no weights)."""
    return attend_in_blocks(query, key, value, attention_mask, scaling, sliding_window, s_aux), None


def attend_in_blocks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """query (B, H, q, d), key / value (B, H_kv, kv, d), mask (B or 1, 1, q, >= kv) bool (True: attend) or
    additive (0 / dtype min), or None: causal with the q queries last, within `window`; sinks (H,) or None
    (Llama's softmax, in fp32). -> (B, q, H, d). Also the draft's attention on CUDA, where SDPA with a mask
    and grouped KV heads falls back to its math kernel and its (q x kv) scores (train/model.py)."""
    B, H, q, d = query.shape
    kv = key.shape[2]
    out = query.new_empty(B, q, H, d)
    rows = block_rows(B, H, q, kv, query.element_size())
    for s in range(0, q, rows):
        e = min(q, s + rows)
        allowed = block_mask(mask, s, e, q, kv, window, query.device)
        lo, hi = key_range(allowed)
        out[:, s:e] = _block(
            query[:, :, s:e], key[:, :, lo:hi], value[:, :, lo:hi], allowed[..., lo:hi], scaling, sinks
        )
    return out


def block_rows(B: int, H: int, q: int, kv: int, element: int) -> int:
    """Query rows a block takes: its scores, their masked and softmaxed copies and the sink column (about 4
    tensors of B x H x rows x kv elements) within the budget."""
    return max(1, min(q, _budget["bytes"] // max(1, 4 * B * H * kv * element)))


def block_mask(
    mask: torch.Tensor | None, s: int, e: int, q: int, kv: int, window: int | None, device
) -> torch.Tensor:
    """Query rows s..e of the mask as bool (B or 1, 1, e-s, kv); None: causal, the q queries at the last
    positions, keys older than `window` hidden (transformers' sliding_window_overlay)."""
    if mask is not None:
        m = mask[:, :, s:e, :kv]  # (a mask may run past the keys, as transformers' eager slices it)
        return m if m.dtype == torch.bool else m == 0
    qpos = torch.arange(kv - q + s, kv - q + e, device=device)[:, None]
    kpos = torch.arange(kv, device=device)[None]
    allowed = kpos <= qpos
    if window:
        allowed &= kpos > qpos - window
    return allowed[None, None]


ALIGN = 256  # key ranges start and end on multiples of this: few distinct matmul shapes (kernel caches)


def key_range(allowed: torch.Tensor) -> tuple[int, int]:
    """The keys any row of the block may see, widened to multiples of ALIGN: [lo, hi)."""
    n = allowed.shape[-1]
    seen = allowed.reshape(-1, n).any(0).nonzero()
    if not len(seen):
        return 0, min(n, ALIGN)
    return int(seen[0]) // ALIGN * ALIGN, min(n, -(-(int(seen[-1]) + 1) // ALIGN) * ALIGN)


def _block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scaling: float, sinks
) -> torch.Tensor:
    """One block, as eager attention computes it: q (B, H, r, d), k / v (B, H_kv, n, d), allowed (B or 1, 1,
    r, n) -> (B, r, H, d). Each step in place where eager makes a new tensor of the same values, so that at
    most three score-sized tensors live at once (block_rows' budget counts four)."""
    B, H, r, d = q.shape
    Hkv, n = k.shape[1], k.shape[2]
    g = H // Hkv  # query heads per KV head: head h reads KV head h // g (transformers' repeat_kv)
    scores = (q.reshape(B, Hkv, g * r, d) @ k.transpose(2, 3)).view(B, H, r, n).mul_(scaling)
    scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
    if sinks is not None:  # gpt-oss's eager_attention_forward: softmax over [scores ‖ sink] in the dtype
        sink = sinks.reshape(1, -1, 1, 1).expand(B, -1, r, -1)  # (its dtype: cat promotes, as eager's does)
        combined = torch.cat([scores, sink], dim=-1)
        del scores
        combined.sub_(combined.max(dim=-1, keepdim=True).values)
        probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)
        del combined
        probs = probs[..., :-1].contiguous()  # the sink column dropped
    else:  # Llama's eager_attention_forward: softmax in fp32
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        del scores
        probs = probs.to(q.dtype)
    o = probs.to(v.dtype).reshape(B, Hkv, g * r, n) @ v
    return o.view(B, H, r, d).transpose(1, 2)


def set_block_bytes(n: int) -> None:
    """The score budget of every later block (tests make blocks small; eval: block_bytes)."""
    _budget["bytes"] = int(n)


@contextmanager
def block_bytes(n: int) -> Iterator[None]:
    """The score budget of the blocks run inside (eval.attention_block_mb), the one before it back after."""
    before = _budget["bytes"]
    set_block_bytes(n)
    try:
        yield
    finally:
        set_block_bytes(before)


def memory_efficient(model) -> None:
    """The target's attention as the loop, the reference and the verdict run it, each with explicit masks
    and memory bounded whatever the prompt: SDPA (memory-efficient kernels) stays; eager (gpt-oss's, for its
    sinks) becomes "eyas_blocked", its math in blocks; any other (flash kernels take no explicit mask) SDPA
    where the model has it, else "eyas_blocked"."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    impl = cfg._attn_implementation
    if impl in ("sdpa", NAME):
        return
    if impl != "eager" and getattr(model, "_supports_sdpa", False):
        model.set_attn_implementation("sdpa")
    else:
        use_blocked_attention(model)


def use_blocked_attention(model) -> None:
    """Register "eyas_blocked" with transformers (its masks: sdpa's bool ones) and switch `model` to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, blocked_attention)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
