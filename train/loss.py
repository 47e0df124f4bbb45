"""The TTT loss of one step, fused with the draft's lm_head: forward KL, LK or cross-entropy.

For normed hidden states x (B, L, H), the draft's lm_head W (V_d, H), target probabilities p
(B, L, V_d) over the draft vocab, a 0/1 weight w (B, L), z = x W^T and q = softmax(z), the loss is
sum_{b,i} w_bi * l(p_bi, q_bi) with l one of (`train.loss`):

    kl   -sum_v p_v log q_v            forward KL up to the target's entropy (EAGLE-3, SpecForge)
         dl/dz = q * sum_v p_v - p
    ce   -log q_a, a = argmax_v p_v    hard cross-entropy on the target's greedy token
         dl/dz = q - onehot(a)
    lk   -log alpha, alpha = sum_v min(p_v, q_v)    the LK loss (Samarin et al., arXiv 2602.23881;
         speculators `neg_log_acceptance_loss`): alpha is the probability that speculative sampling
         accepts a token drawn from q, so this trains acceptance at temperature 1 directly.
         With m_v = [q_v < p_v]: dalpha/dz = q * m - q * sum_v(q_v m_v); dl/dz = -dalpha/dz / alpha
         (alpha clamped at 1e-5, as speculators does; below it the gradient is 0)

and dx = dz W, dW = sum dz^T x.

`linear_loss` runs over positions in chunks of about `budget` logits and computes
the gradients of x and W in the same pass (the "fused linear cross-entropy" of Liger and
SpecForge's Triton loss, in plain torch): the (B, L, V_d) logits are never all held (4 GB per TTT
step in fp32 at gpt-oss-120b's 32000 draft ids and L = 32K), the lm_head matmul is not recomputed
in backward, and backward only scales the stored gradients. Under autocast the matmuls run in
the autocast dtype, as the unfused ops would; softmax and the loss are fp32.

`reference_loss` is the same loss through autograd (the test holds them equal), and
the path for weights that exist only inside their module's forward (DeepSpeed ZeRO-3 partitions
them and gathers them in the module's hooks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BUDGET = 1 << 26  # logits per chunk: 256 MiB in fp32; 2,097 positions at gpt-oss-120b's 32000 draft ids
LOSSES = ("kl", "lk", "ce")
LK_MIN_ALPHA = 1e-5


def loss_and_grad(
    kind: str, z: torch.Tensor, p: torch.Tensor, with_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position loss l(p, softmax(z)) and dl/dz: z, p (..., V) fp32 -> ((...), (..., V) or None)."""
    logq = F.log_softmax(z, dim=-1)
    if kind == "ce":
        p = F.one_hot(p.argmax(-1), p.shape[-1]).to(z.dtype)
    if kind in ("kl", "ce"):
        loss = -(p * logq).sum(-1)
        return loss, (logq.exp() * p.sum(-1, keepdim=True) - p) if with_grad else None
    if kind != "lk":
        raise ValueError(f"unknown loss {kind!r}; choose one of {', '.join(LOSSES)}")
    q = logq.exp()
    alpha = torch.minimum(p, q).sum(-1)
    loss = -torch.log(alpha.clamp(min=LK_MIN_ALPHA))
    if not with_grad:
        return loss, None
    qm = q * (q < p)
    dalpha = qm - q * qm.sum(-1, keepdim=True)
    # alpha 0 (a teacher row left zero: train/ttt.py teacher_rows; no top-k mass in the draft vocab): no
    # gradient, and not 0 / 0
    return loss, -dalpha / alpha.clamp(min=LK_MIN_ALPHA)[..., None] * (alpha > LK_MIN_ALPHA)[..., None]


def chunk_positions(B: int, V: int, budget: int = BUDGET) -> int:
    """Positions per chunk so that one chunk's fp32 logits (B, c, V) hold about `budget` values."""
    return max(1, budget // max(1, B * V))


class _LinearLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, probs, w, with_grad: bool, budget: int, kind: str, grad_w: bool = True):
        # x (B, L, H); weight (V_d, H); probs (B, L, V_d); w (B, L) -> (scalar fp32, argmax (B, L) int64)
        B, L, _ = x.shape
        c = chunk_positions(B, weight.shape[0], budget)
        acc = torch.promote_types(x.dtype, torch.float32)  # softmax, loss and dW: fp32 (fp64 in fp64)
        total = torch.zeros((), dtype=acc, device=x.device)
        pred = torch.empty(B, L, dtype=torch.int64, device=x.device)
        dev = x.device.type
        mm = (
            torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        )  # the matmuls' dtype
        # the gradients are kept until backward in the matmuls' dtype (bf16 under autocast: 0.4 GB per TTT
        # step at gpt-oss size and T = 32K), dW summed over chunks in fp32 first
        dx = torch.empty(x.shape, dtype=mm, device=x.device) if with_grad else None
        # dW only for a trained lm_head: a frozen one (draft.lm_head target_frozen) would hold a (V_d, H) fp32
        # sum per call until backward (2.3 GB a DFlash draft at gpt-oss's whole vocabulary)
        grad_w = with_grad and grad_w
        dw = torch.zeros(weight.shape, dtype=acc, device=x.device) if grad_w else None
        W = weight.to(mm)  # cast once (V_d, H)
        for s in range(0, L, c):
            xc = x[:, s : s + c].to(mm)  # (B, c, H)
            pc, wc = probs[:, s : s + c].to(acc), w[:, s : s + c, None].to(acc)  # (B, c, V_d), (B, c, 1)
            z = (xc @ W.T).to(acc)  # (B, c, V_d)
            loss, dz = loss_and_grad(kind, z, pc, with_grad)  # (B, c), (B, c, V_d)
            total += (loss[..., None] * wc).sum()
            pred[:, s : s + c] = z.argmax(-1)
            if with_grad:
                dz = (dz * wc).to(mm)
                dx[:, s : s + c] = dz @ W  # (B, c, H)
                if grad_w:  # (V_d, H), in place: no fp32 copy of the product
                    dw += dz.flatten(0, 1).T @ xc.flatten(0, 1)
            # freed before the next chunk's logits exist: a chunk at a time holds one chunk's
            # (eyas/plan/cost.py loss_scratch_bytes), not the last one's gradient beside it
            del z, dz
        ctx.save_for_backward(dx, dw.to(mm) if grad_w else None)
        ctx.dtypes = x.dtype, weight.dtype
        ctx.mark_non_differentiable(pred)
        return total, pred

    @staticmethod
    def backward(ctx, g, _):
        dx, dw = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        gx = dx.to(x_dtype) * g if ctx.needs_input_grad[0] else None
        gw = dw.to(w_dtype) * g if ctx.needs_input_grad[1] and dw is not None else None
        return gx, gw, None, None, None, None, None, None


def linear_loss(
    x: torch.Tensor,
    weight: torch.Tensor,
    probs: torch.Tensor,
    w: torch.Tensor,
    kind: str = "kl",
    budget: int = BUDGET,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, L, H) normed hidden states, weight (V_d, H), probs (B, L, V_d), w (B, L) ->
    (sum of the w-weighted loss `kind`, fp32 scalar; the draft's argmax (B, L) draft ids)."""
    with_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return _LinearLoss.apply(x, weight, probs, w, with_grad, budget, kind, weight.requires_grad)


def position_loss(kind: str, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The loss `kind` per position, through autograd (the definitions above): (B, L, V_d) -> (B, L)."""
    logq = F.log_softmax(logits.float(), dim=-1)
    if kind == "kl":
        return -(probs * logq).sum(-1)
    if kind == "ce":
        return F.nll_loss(logq.transpose(1, -1), probs.argmax(-1), reduction="none")
    if kind == "lk":
        return -torch.log(torch.minimum(probs, logq.exp()).sum(-1).clamp(min=LK_MIN_ALPHA))
    raise ValueError(f"unknown loss {kind!r}; choose one of {', '.join(LOSSES)}")


def reference_loss(
    logits_fn,
    hidden: torch.Tensor,
    probs: torch.Tensor,
    w: torch.Tensor,
    kind: str = "kl",
    budget: int = BUDGET,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same sum through autograd: logits_fn (B, c, H) -> (B, c, V_d) (the draft's norm and lm_head
    modules, so module hooks run). Chunks of positions are recomputed in backward; the hidden states
    are split once, so their gradient is assembled once, not once per chunk."""
    B, L, _ = hidden.shape
    c = chunk_positions(B, probs.shape[-1], budget)

    def one(h, p, m):
        logits = logits_fn(h)
        return (position_loss(kind, logits, p) * m).sum(), logits.argmax(-1).detach()

    if L <= c or not torch.is_grad_enabled():
        return one(hidden, probs, w)
    sums, preds = [], []
    for h, p, m in zip(hidden.split(c, dim=1), probs.split(c, dim=1), w.split(c, dim=1)):
        ce, pred = torch.utils.checkpoint.checkpoint(one, h, p, m, use_reentrant=False)
        sums.append(ce)
        preds.append(pred)
    return torch.stack(sums).sum(), torch.cat(preds, dim=1)
