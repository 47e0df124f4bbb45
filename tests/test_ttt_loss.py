"""The fused lm_head + soft cross-entropy (`train/loss.py`) equals the same loss through autograd."""

import pytest
import torch

from eyas.train.loss import linear_soft_cross_entropy, reference_soft_cross_entropy


def case(B=2, L=37, H=16, V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, H, generator=g).requires_grad_()
    W = (torch.randn(V, H, generator=g) * 0.5).requires_grad_()
    p = torch.softmax(torch.randn(B, L, V, generator=g) * 2, -1)
    m = torch.rand(B, L, generator=g) > 0.3
    return x, W, p, m


@pytest.mark.parametrize("budget", [1 << 24, 2 * 50 * 5, 2 * 50])  # one chunk; chunks of 5; one position each
def test_fused_equals_autograd(budget):
    x, W, p, m = case()
    total, pred = linear_soft_cross_entropy(x, W, p, m, budget)
    gx, gw = torch.autograd.grad(0.7 * total, (x, W))
    ref, ref_pred = reference_soft_cross_entropy(lambda h: h @ W.T, x, p, m, budget)
    rx, rw = torch.autograd.grad(0.7 * ref, (x, W))
    assert torch.equal(pred, ref_pred)
    assert pred.shape == (2, 37) and pred.dtype == torch.int64
    torch.testing.assert_close(total, ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(gx, rx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, rw, rtol=1e-5, atol=1e-6)
    assert gx[~m].abs().max() == 0  # unweighted positions get no gradient


def test_fused_under_bf16_autocast():
    """bf16 matmuls as the unfused ops under autocast would run them; softmax and loss fp32."""
    x, W, p, m = case(L=64, H=64, V=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total, _ = linear_soft_cross_entropy(x, W, p, m, 2 * 300 * 8)
        ref, _ = reference_soft_cross_entropy(lambda h: h @ W.T, x, p, m, 2 * 300 * 8)
    assert total.dtype == torch.float32
    gx, gw = torch.autograd.grad(total, (x, W))
    rx, rw = torch.autograd.grad(ref, (x, W))
    assert gx.dtype == x.dtype and gw.dtype == W.dtype
    torch.testing.assert_close(total, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(gx, rx, rtol=2e-2, atol=2e-2 * rx.abs().max().item())
    torch.testing.assert_close(gw, rw, rtol=2e-2, atol=2e-2 * rw.abs().max().item())


def test_no_grad_computes_no_gradient():
    x, W, p, m = case()
    with torch.no_grad():
        total, pred = linear_soft_cross_entropy(x, W, p, m)
    ref, ref_pred = reference_soft_cross_entropy(lambda h: h @ W.T, x.detach(), p, m)
    assert not total.requires_grad
    torch.testing.assert_close(total, ref.detach(), rtol=1e-6, atol=1e-5)
    assert torch.equal(pred, ref_pred)
