"""The TTT loss of one step: soft cross-entropy of the draft's lm_head against the target, fused.

For normed hidden states x (B, L, H), the draft's lm_head W (V_d, H), target probabilities p
(B, L, V_d) over the draft vocab and a 0/1 weight w (B, L):

    loss = sum_{b,i} w_bi * ( -sum_v p_biv * log softmax(x_bi W^T)_v )        (a scalar)
    dloss/dz_bi = w_bi * (softmax(z_bi) * sum_v p_biv - p_bi)                 z = x W^T
    dx = dz W,   dW = sum dz^T x

`linear_soft_cross_entropy` runs over positions in chunks of about `budget` logits and computes
the gradients of x and W in the same pass (the "fused linear cross-entropy" of Liger and
SpecForge's Triton loss, in plain torch): the (B, L, V_d) logits are never all held (4 GB per TTT
step in fp32 at gpt-oss-120b's 32000 draft ids and L = 32K), the lm_head matmul is not recomputed
in backward, and backward only scales the stored gradients. Under autocast the matmuls run in
the autocast dtype, as the unfused ops would; softmax and the loss are fp32.

`reference_soft_cross_entropy` is the same loss through autograd (the test holds them equal), and
the path for weights that exist only inside their module's forward (DeepSpeed ZeRO-3 partitions
them and gathers them in the module's hooks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


BUDGET = 1 << 26  # logits per chunk: 256 MiB in fp32; 2,097 positions at gpt-oss-120b's 32000 draft ids


def chunk_positions(B: int, V: int, budget: int = BUDGET) -> int:
    """Positions per chunk so that one chunk's fp32 logits (B, c, V) hold about `budget` values."""
    return max(1, budget // max(1, B * V))


class _LinearSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, probs, w, with_grad: bool, budget: int):
        # x (B, L, H); weight (V_d, H); probs (B, L, V_d); w (B, L) -> (scalar fp32, argmax (B, L) int64)
        B, L, _ = x.shape
        c = chunk_positions(B, weight.shape[0], budget)
        acc = torch.promote_types(x.dtype, torch.float32)  # softmax, loss and dW: fp32 (fp64 in fp64)
        total = torch.zeros((), dtype=acc, device=x.device)
        pred = torch.empty(B, L, dtype=torch.int64, device=x.device)
        dev = x.device.type
        mm = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype  # the matmuls' dtype
        # the gradients are kept until backward in the matmuls' dtype (bf16 under autocast: 0.4 GB per TTT
        # step at gpt-oss size and T = 32K), dW summed over chunks in fp32 first
        dx = torch.empty(x.shape, dtype=mm, device=x.device) if with_grad else None
        dw = torch.zeros(weight.shape, dtype=acc, device=x.device) if with_grad else None
        W = weight.to(mm)  # cast once (V_d, H)
        for s in range(0, L, c):
            xc = x[:, s:s + c].to(mm)  # (B, c, H)
            pc, wc = probs[:, s:s + c].to(acc), w[:, s:s + c, None].to(acc)  # (B, c, V_d), (B, c, 1)
            z = (xc @ W.T).to(acc)  # (B, c, V_d)
            logq = F.log_softmax(z, dim=-1)
            total += -((pc * logq).sum(-1, keepdim=True) * wc).sum()
            pred[:, s:s + c] = z.argmax(-1)
            if with_grad:
                dz = ((logq.exp() * pc.sum(-1, keepdim=True) - pc) * wc).to(mm)  # (B, c, V_d)
                dx[:, s:s + c] = dz @ W  # (B, c, H)
                dw += dz.flatten(0, 1).T @ xc.flatten(0, 1)  # (V_d, H), in place: no fp32 copy of the product
        ctx.save_for_backward(dx, dw.to(mm) if with_grad else None)
        ctx.dtypes = x.dtype, weight.dtype
        ctx.mark_non_differentiable(pred)
        return total, pred

    @staticmethod
    def backward(ctx, g, _):
        dx, dw = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        gx = dx.to(x_dtype) * g if ctx.needs_input_grad[0] else None
        gw = dw.to(w_dtype) * g if ctx.needs_input_grad[1] else None
        return gx, gw, None, None, None, None


def linear_soft_cross_entropy(x: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, w: torch.Tensor,
                              budget: int = BUDGET) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, L, H) normed hidden states, weight (V_d, H), probs (B, L, V_d), w (B, L) ->
    (sum of w-weighted soft CE, fp32 scalar; the draft's argmax (B, L) draft ids)."""
    with_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return _LinearSoftCE.apply(x, weight, probs, w, with_grad, budget)


def soft_cross_entropy(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Per-position forward KL up to the target's entropy: -(p * log q).sum(-1). (B, L, V_d) -> (B, L)."""
    return -(probs * F.log_softmax(logits.float(), dim=-1)).sum(-1)


def reference_soft_cross_entropy(logits_fn, hidden: torch.Tensor, probs: torch.Tensor, w: torch.Tensor,
                                 budget: int = BUDGET) -> tuple[torch.Tensor, torch.Tensor]:
    """The same sum through autograd: logits_fn (B, c, H) -> (B, c, V_d) (the draft's norm and lm_head
    modules, so module hooks run). Chunks of positions are recomputed in backward; the hidden states
    are split once, so their gradient is assembled once, not once per chunk."""
    B, L, _ = hidden.shape
    c = chunk_positions(B, probs.shape[-1], budget)

    def one(h, p, m):
        logits = logits_fn(h)
        return (soft_cross_entropy(logits, p) * m).sum(), logits.argmax(-1).detach()

    if L <= c or not torch.is_grad_enabled():
        return one(hidden, probs, w)
    sums, preds = [], []
    for h, p, m in zip(hidden.split(c, dim=1), probs.split(c, dim=1), w.split(c, dim=1)):
        ce, pred = torch.utils.checkpoint.checkpoint(one, h, p, m, use_reentrant=False)
        sums.append(ce)
        preds.append(pred)
    return torch.stack(sums).sum(), torch.cat(preds, dim=1)
