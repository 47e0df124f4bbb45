"""TTT attention: the EAGLE-3 training-time-test pattern, three ways that compute the same thing.

At TTT step j the query at index i sees

    * the step-0 keys at indices t <= i of the same document (the verified prefix: causal, and
      with sequence packing only within the sequence index i belongs to), and
    * the keys of steps 1..j at index i itself (its own draft chain: one "diagonal" per step).

Inputs, for every implementation:

    q        (B, nh, T, d)      step j's queries (RoPE applied)
    keys     [j+1] x (B, nkv, T, d)   keys of steps 0..j, KV heads NOT repeated (GQA: nh = r * nkv)
    values   [j+1] x (B, nkv, T, d)
    doc      (B, T) int         document id per position, non-decreasing along a row (padding: a
                                last id of its own), see `train/packing.py`
    -> o     (B, nh, T, d)

Implementations (`train.attention` in the recipe):

    dense    the (T x T) scores of every step materialised: the reference, O(T^2) memory.
    chunked  blockwise online softmax over (query block x key block) tiles, in a custom autograd
             function whose backward recomputes each tile from the saved log-sum-exp (the
             FlashAttention recurrences), so nothing larger than a tile is ever held: O(T) memory.
             Plain torch ops: runs on CPU and GPU.
    sdpa     torch's fused flash-attention CPU kernel (the one behind scaled_dot_product_attention)
             over the step-0 keys, causal, one call per document run; its log-sum-exp merges the
             diagonals in. Backward calls the kernel's own backward with the merged output and
             log-sum-exp, which gives exactly the step-0 part of the merged softmax's gradients.
             O(T) memory; forward + backward about 7x faster than chunked on CPU (64 heads, T = 2K).
    flex     torch's FlexAttention (compiled, GPU) over the keys of steps 0..j concatenated, with
             a block mask for the pattern above; fully masked tiles are skipped, so the cost is the
             causal half plus j diagonal tiles per query block: O(T) memory.

`tests/test_ttt_attention.py` holds chunked and sdpa (and flex, on a GPU) equal to dense in output,
loss and every gradient.
"""

from __future__ import annotations

import math

import torch

IMPLEMENTATIONS = ("auto", "dense", "chunked", "sdpa", "flex")


def resolve(impl: str, device: torch.device, window: int | None = None) -> str:
    """`auto` -> flex on CUDA (where FlexAttention compiles), sdpa on CPU (chunked with a window: the
    kernel has none), chunked elsewhere."""
    if impl == "sdpa" and device.type != "cpu":
        raise ValueError(f"train.attention: sdpa is torch's CPU kernel; on {device.type} use flex or chunked")
    if impl == "sdpa" and window:
        raise ValueError(
            "train.attention: sdpa (torch's flash CPU kernel) has no sliding window; with "
            "draft.sliding_window use chunked (or auto)"
        )
    if impl != "auto":
        return impl
    if device.type == "cuda" and flex_available():
        return "flex"
    return "sdpa" if device.type == "cpu" and sdpa_available() and not window else "chunked"


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def ttt_attention(
    impl: str,
    q: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    doc: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """`window` (draft.sliding_window): the query of step j = len(keys) - 1 at index i sits at position i + j
    and sees step-0 keys at indices t > i + j - window only (its own chain's keys are nearer)."""
    fn = {"dense": dense, "chunked": chunked, "sdpa": sdpa, "flex": flex}.get(impl)
    if fn is None:
        raise ValueError(f"unknown TTT attention {impl!r} (expected one of {', '.join(IMPLEMENTATIONS[1:])})")
    if impl == "sdpa":
        if window:
            raise ValueError("the sdpa TTT attention has no sliding window (train/attention.py resolve)")
        return fn(q, keys, values, doc, scale)
    return fn(q, keys, values, doc, scale, oldest_offset(len(keys) - 1, window))


def oldest_offset(j: int, window: int | None) -> int | None:
    """Step j's window as an offset: step-0 key t is visible to index i only if t > i + offset (None: all)."""
    return j - window if window else None


def visible(
    doc_q: torch.Tensor, doc_k: torch.Tensor, q0: int, k0: int, offset: int | None = None
) -> torch.Tensor:
    """Step-0 visibility of keys k0.. to queries q0..: causal, same document, and (`offset`, a window) newer
    than index + offset. doc_q (B, C_q), doc_k (B, C_k) -> (B, C_q, C_k) bool."""
    qi = torch.arange(q0, q0 + doc_q.shape[1], device=doc_q.device)
    ki = torch.arange(k0, k0 + doc_k.shape[1], device=doc_k.device)
    seen = ki[None, :] <= qi[:, None]
    if offset is not None:
        seen = seen & (ki[None, :] > qi[:, None] + offset)
    return seen[None] & (doc_k[:, None, :] == doc_q[:, :, None])


# --------------------------------------------------------------------------- dense (reference)


def dense(q, keys, values, doc, scale, offset=None):
    """(B, nh, T, T) scores against the step-0 keys plus one diagonal score per later step."""
    rep = q.shape[1] // keys[0].shape[1]
    keys = [k.repeat_interleave(rep, dim=1) for k in keys]
    values = [v.repeat_interleave(rep, dim=1) for v in values]
    T = q.shape[2]
    s0 = (q @ keys[0].transpose(-1, -2)) * scale  # (B, nh, T, T)
    s0 = s0.masked_fill(~visible(doc, doc, 0, 0, offset)[:, None], float("-inf"))
    diag = [((q * k).sum(-1) * scale)[..., None] for k in keys[1:]]  # each (B, nh, T, 1)
    p = torch.softmax(torch.cat([s0, *diag], dim=-1).float(), dim=-1).to(q.dtype)
    o = p[..., :T] @ values[0]
    for m, v in enumerate(values[1:], start=1):
        o = o + p[..., T + m - 1 : T + m] * v
    return o


# --------------------------------------------------------------------------- chunked (O(T), any device)


def tile_size(B: int, nh: int, T: int, budget: int = 1 << 24) -> int:
    """Query/key tile edge so that one fp32 score tile (B, nh, C, C) holds about `budget` elements
    (64 MiB): 512 for gpt-oss's 64 heads at B = 1, capped at T."""
    c = int(math.sqrt(budget / max(1, B * nh)))
    c = max(16, 1 << (c.bit_length() - 1))  # a power of two
    return min(c, max(16, T))


def _tiles(doc: torch.Tensor, T: int, C: int, offset: int | None = None):
    """(q0, q1, [(k0, k1), ...]) for every query tile, keeping only key tiles some query of the tile
    can see: at or before the diagonal, not wholly in earlier documents (doc is non-decreasing), and not
    wholly older than the window (`offset`)."""
    doc = doc.cpu()  # one copy, no device sync per tile
    for q0 in range(0, T, C):
        q1 = min(T, q0 + C)
        first_doc = doc[:, q0]  # (B,) the smallest doc id in this query tile
        ks = []
        for k0 in range(0, q1, C):
            k1 = min(q1, k0 + C)
            if bool((doc[:, k1 - 1] < first_doc).all()):  # every key of the tile is in an earlier document
                continue
            if offset is not None and k1 - 1 <= q0 + offset:  # every key too old for every query of the tile
                continue
            ks.append((k0, k1))
        yield q0, q1, ks


class _ChunkedTTTAttention(torch.autograd.Function):
    """Forward: online softmax over key tiles, then the diagonals; saves o and the log-sum-exp.
    Backward: recomputes each tile's probabilities from the saved lse. Shapes as the module doc,
    with q grouped as (B, nkv, r, T, d) so KV heads are never repeated."""

    @staticmethod
    def forward(ctx, q, doc, scale, offset, n_diag, k0, v0, *diag):
        B, nh, T, d = q.shape
        nkv = k0.shape[1]
        r = nh // nkv
        kd, vd = diag[:n_diag], diag[n_diag:]  # keys/values of steps 1..j, (B, nkv, T, d) each
        qg = q.view(B, nkv, r, T, d)
        C = tile_size(B, nh, T)
        o = torch.empty_like(qg)
        lse = torch.empty(B, nkv, r, T, dtype=torch.float32, device=q.device)
        for q0, q1, ktiles in _tiles(doc, T, C, offset):
            qb = qg[:, :, :, q0:q1]  # (B, nkv, r, c, d)
            m = torch.full(qb.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)  # running max
            l = torch.zeros_like(m)  # running sum of exp
            acc = torch.zeros(qb.shape, dtype=torch.float32, device=q.device)  # running sum of p v
            for a, b in ktiles:
                s = (qb @ k0[:, :, None, a:b].transpose(-1, -2)).float() * scale  # (B, nkv, r, c, c_k)
                seen = visible(doc[:, q0:q1], doc[:, a:b], q0, a, offset)
                s = s.masked_fill(~seen[:, None, None], float("-inf"))
                m_new = torch.maximum(m, s.amax(-1))
                m_use = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows that have seen no key yet
                p = torch.exp(s - m_use[..., None])
                alpha = torch.exp(m - m_use)
                l = l * alpha + p.sum(-1)
                acc = acc * alpha[..., None] + p.to(v0.dtype) @ v0[:, :, None, a:b]
                m = m_new
            for kk, vv in zip(kd, vd):  # own chain: one score per query
                s = (qb.float() * kk[:, :, None, q0:q1].float()).sum(
                    -1
                ) * scale  # (B, nkv, r, c), fp32 as in backward
                m_new = torch.maximum(m, s)
                p = torch.exp(s - m_new)
                alpha = torch.exp(m - m_new)
                l = l * alpha + p
                acc = acc * alpha[..., None] + p[..., None] * vv[:, :, None, q0:q1].float()
                m = m_new
            o[:, :, :, q0:q1] = (acc / l[..., None]).to(o.dtype)
            lse[:, :, :, q0:q1] = m + torch.log(l)
        ctx.save_for_backward(q, doc, o, lse, k0, v0, *diag)
        ctx.scale, ctx.n_diag, ctx.C, ctx.offset = scale, n_diag, C, offset
        # the dtype the tile matmuls above ran in (autocast's, where it is on), for backward to recompute
        # the same scores: backward runs outside autocast, where q and k may hold different dtypes
        dev = q.device.type
        on = torch.is_autocast_enabled(dev)
        ctx.mm = torch.get_autocast_dtype(dev) if on else torch.promote_types(q.dtype, k0.dtype)
        return o.view(B, nh, T, d)

    @staticmethod
    def backward(ctx, do):
        q, doc, o, lse, k0, v0, *diag = ctx.saved_tensors
        scale, n_diag, C, offset = ctx.scale, ctx.n_diag, ctx.C, ctx.offset
        kd, vd = diag[:n_diag], diag[n_diag:]
        B, nh, T, d = q.shape
        nkv = k0.shape[1]
        r = nh // nkv
        qg = q.view(B, nkv, r, T, d)
        dog = do.reshape(B, nkv, r, T, d)
        D = (dog.float() * o.float()).sum(-1)  # (B, nkv, r, T): rowsum(dO * O)
        f32 = dict(dtype=torch.float32, device=q.device)
        dq = torch.zeros(qg.shape, **f32)
        dk0, dv0 = torch.zeros(k0.shape, **f32), torch.zeros(v0.shape, **f32)
        dkd = [torch.zeros(k.shape, **f32) for k in kd]
        dvd = [torch.zeros(v.shape, **f32) for v in vd]
        mm = ctx.mm
        for q0, q1, ktiles in _tiles(doc, T, C, offset):
            qb, dob = qg[:, :, :, q0:q1], dog[:, :, :, q0:q1]
            lse_b, D_b = lse[:, :, :, q0:q1, None], D[:, :, :, q0:q1, None]
            dob32 = dob.float()
            for a, b in ktiles:
                kb, vb = k0[:, :, None, a:b], v0[:, :, None, a:b]  # (B, nkv, 1, c_k, d)
                s = (qb.to(mm) @ kb.to(mm).transpose(-1, -2)).float() * scale
                seen = visible(doc[:, q0:q1], doc[:, a:b], q0, a, offset)
                s = s.masked_fill(~seen[:, None, None], float("-inf"))
                p = torch.exp(s - lse_b)  # (B, nkv, r, c, c_k), the forward's probabilities
                dv0[:, :, a:b] += torch.einsum("bgrck,bgrcd->bgkd", p, dob32)
                dp = (dob.to(mm) @ vb.to(mm).transpose(-1, -2)).float()
                ds = p * (dp - D_b) * scale
                dq[:, :, :, q0:q1] += ds @ kb.float()
                dk0[:, :, a:b] += torch.einsum("bgrck,bgrcd->bgkd", ds, qb.float())
            for m, (kk, vv) in enumerate(zip(kd, vd)):
                kb, vb = kk[:, :, None, q0:q1].float(), vv[:, :, None, q0:q1].float()  # (B, nkv, 1, c, d)
                s = (qb.float() * kb).sum(-1, keepdim=True) * scale  # (B, nkv, r, c, 1)
                p = torch.exp(s - lse_b)
                dvd[m][:, :, q0:q1] += (p * dob32).sum(2)
                ds = p * ((dob32 * vb).sum(-1, keepdim=True) - D_b) * scale
                dq[:, :, :, q0:q1] += ds * kb
                dkd[m][:, :, q0:q1] += (ds * qb.float()).sum(2)
        grads = [dq.view(B, nh, T, d).to(q.dtype), None, None, None, None, dk0.to(k0.dtype), dv0.to(v0.dtype)]
        grads += [g.to(k.dtype) for g, k in zip(dkd, kd)] + [g.to(v.dtype) for g, v in zip(dvd, vd)]
        return tuple(grads)


def chunked(q, keys, values, doc, scale, offset=None):
    return _ChunkedTTTAttention.apply(
        q, doc, scale, offset, len(keys) - 1, keys[0], values[0], *keys[1:], *values[1:]
    )


# --------------------------------------------------------------------------- sdpa (O(T), CPU)


def _flash_cpu():
    """torch's flash-attention CPU kernel and its backward: (q, k, v, dropout, causal, scale=) ->
    (o, lse (B, h, T) fp32); None where this torch has no such kernel."""
    try:
        return (
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward,
        )
    except (AttributeError, RuntimeError):
        return None


def sdpa_available() -> bool:
    return _flash_cpu() is not None


def _runs(doc: torch.Tensor):
    """[(rows, t0, t1)]: the runs of one document id. One entry per run for the whole batch where
    every row has the same boundaries (no packing), else per row."""
    doc = doc.cpu()
    B, T = doc.shape
    change = doc[:, 1:] != doc[:, :-1]  # (B, T - 1)
    same = bool((change == change[:1]).all())
    runs = []
    for b in [0] if same else range(B):
        cuts = [0, *(torch.nonzero(change[b]).flatten() + 1).tolist(), T]
        rows = slice(None) if same else slice(b, b + 1)
        runs += [(rows, t0, t1) for t0, t1 in zip(cuts, cuts[1:])]
    return runs


class _SdpaTTTAttention(torch.autograd.Function):
    """Forward: the kernel over each document run of the step-0 keys gives (o0, lse0); with the
    diagonal scores s_m, lse = logsumexp(lse0, s_1..s_j) and o = e^(lse0-lse) o0 + sum e^(s_m-lse) v_m.
    Backward: for the step-0 keys the kernel's backward with the merged (o, lse) recomputes
    P = exp(S - lse) and D = rowsum(dO * o): the merged softmax's gradients; the diagonals are
    elementwise. KV heads are repeated for the kernel (B, nh, T, d), O(T)."""

    @staticmethod
    def forward(ctx, q, doc, scale, n_diag, k0, v0, *diag):
        attend, _ = _flash_cpu()
        B, nh, T, d = q.shape
        nkv = k0.shape[1]
        r = nh // nkv
        k0r, v0r = (x.to(q.dtype).repeat_interleave(r, dim=1) for x in (k0, v0))  # (B, nh, T, d)
        runs = _runs(doc)
        o0 = torch.empty_like(q)
        lse0 = torch.empty(B, nh, T, dtype=torch.float32, device=q.device)
        for rows, a, b in runs:
            o0[rows, :, a:b], lse0[rows, :, a:b] = attend(
                q[rows, :, a:b], k0r[rows, :, a:b], v0r[rows, :, a:b], 0.0, True, scale=scale
            )
        qg = q.view(B, nkv, r, T, d).float()
        kd, vd = diag[:n_diag], diag[n_diag:]
        s = [
            (qg * k.float()[:, :, None]).sum(-1).view(B, nh, T) * scale for k in kd
        ]  # own chain, (B, nh, T) each
        lse = torch.logsumexp(torch.stack([lse0, *s]), dim=0)  # (B, nh, T)
        o = o0.float() * torch.exp(lse0 - lse)[..., None]
        for sm, v in zip(s, vd):
            o = o + (torch.exp(sm - lse).view(B, nkv, r, T, 1) * v.float()[:, :, None]).view(B, nh, T, d)
        o = o.to(q.dtype)
        ctx.save_for_backward(q, doc, o, lse, k0, v0, *diag)
        ctx.scale, ctx.n_diag, ctx.runs = scale, n_diag, runs
        return o

    @staticmethod
    def backward(ctx, do):
        _, attend_backward = _flash_cpu()
        q, doc, o, lse, k0, v0, *diag = ctx.saved_tensors
        scale, n_diag = ctx.scale, ctx.n_diag
        B, nh, T, d = q.shape
        nkv = k0.shape[1]
        r = nh // nkv
        do = do.contiguous().to(q.dtype)
        k0r, v0r = (x.to(q.dtype).repeat_interleave(r, dim=1) for x in (k0, v0))
        dq, dk0r, dv0r = torch.empty_like(q), torch.empty_like(k0r), torch.empty_like(v0r)
        for rows, a, b in ctx.runs:
            part = (t[rows, :, a:b].contiguous() for t in (do, q, k0r, v0r, o))
            dq[rows, :, a:b], dk0r[rows, :, a:b], dv0r[rows, :, a:b] = attend_backward(
                *part, lse[rows, :, a:b].contiguous(), 0.0, True, scale=scale
            )
        dq = dq.float().view(B, nkv, r, T, d)
        qg, dog = q.view(B, nkv, r, T, d).float(), do.view(B, nkv, r, T, d).float()
        D = (dog * o.view(B, nkv, r, T, d).float()).sum(-1)  # (B, nkv, r, T): rowsum(dO * O)
        lse_g = lse.view(B, nkv, r, T)
        dkd, dvd = [], []
        for kk, vv in zip(diag[:n_diag], diag[n_diag:]):
            kb, vb = kk.float()[:, :, None], vv.float()[:, :, None]  # (B, nkv, 1, T, d)
            p = torch.exp((qg * kb).sum(-1) * scale - lse_g)  # (B, nkv, r, T)
            dvd.append((p[..., None] * dog).sum(2).to(vv.dtype))
            ds = p * ((dog * vb).sum(-1) - D) * scale
            dq += ds[..., None] * kb
            dkd.append((ds[..., None] * qg).sum(2).to(kk.dtype))
        dk0 = dk0r.float().view(B, nkv, r, T, d).sum(2).to(k0.dtype)
        dv0 = dv0r.float().view(B, nkv, r, T, d).sum(2).to(v0.dtype)
        return (dq.view(B, nh, T, d).to(q.dtype), None, None, None, dk0, dv0, *dkd, *dvd)


def sdpa(q, keys, values, doc, scale):
    return _SdpaTTTAttention.apply(
        q.contiguous(), doc, scale, len(keys) - 1, keys[0], values[0], *keys[1:], *values[1:]
    )


# --------------------------------------------------------------------------- flex (O(T), GPU)

_FLEX = {}
FLEX_BLOCK = 128  # FlexAttention's tile; T is padded up to a multiple of it


def _compiled():
    """torch.compile'd flex_attention and create_block_mask, built once per process. Shapes are
    compiled automatically dynamic after the first recompile (as transformers and SpecForge do);
    padding T to a multiple of FLEX_BLOCK keeps the number of distinct shapes small."""
    if not _FLEX:
        import torch._dynamo
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _FLEX["attention"] = torch.compile(flex_attention)
        _FLEX["block_mask"] = torch.compile(create_block_mask)
    return _FLEX["attention"], _FLEX["block_mask"]


def flex(q, keys, values, doc, scale, offset=None):
    attention, block_mask = _compiled()
    B, nh, T, d = q.shape
    Tp = -(-T // FLEX_BLOCK) * FLEX_BLOCK
    pad = Tp - T
    if pad:
        pad4 = (0, 0, 0, pad)
        q = torch.nn.functional.pad(q, pad4)
        keys = [torch.nn.functional.pad(k, pad4) for k in keys]
        values = [torch.nn.functional.pad(v, pad4) for v in values]
        doc = torch.nn.functional.pad(doc, (0, pad), value=int(doc.max()) + 1)  # padding: its own document
    n = len(keys)
    K, V = torch.cat(keys, dim=2), torch.cat(values, dim=2)  # (B, nkv, n * Tp, d): steps side by side

    def mask_mod(b, h, q_idx, kv_idx):
        step, t = kv_idx // Tp, kv_idx % Tp
        prefix = (t <= q_idx) & (doc[b, t] == doc[b, q_idx])  # step 0: causal, same document
        if offset is not None:  # and within the window
            prefix = prefix & (t > q_idx + offset)
        return torch.where(step == 0, prefix, t == q_idx)  # steps 1..j: the query's own index

    bm = block_mask(mask_mod, B, None, Tp, n * Tp, device=q.device)
    o = attention(q, K, V, block_mask=bm, scale=scale, enable_gqa=True)
    return o[:, :, :T]
