"""The fused lm_head + loss (`train/loss.py`: kl, lk, ce) equals the same loss through autograd."""

import pytest
import torch

from eyas.train.loss import LOSSES, linear_loss, position_loss, reference_loss


def case(B=2, L=37, H=16, V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, H, generator=g).requires_grad_()
    W = (torch.randn(V, H, generator=g) * 0.5).requires_grad_()
    p = torch.softmax(torch.randn(B, L, V, generator=g) * 2, -1)
    m = torch.rand(B, L, generator=g) > 0.3
    return x, W, p, m


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("budget", [1 << 24, 2 * 50 * 5, 2 * 50])  # one chunk; chunks of 5; one position each
def test_fused_equals_autograd(budget, kind):
    x, W, p, m = case()
    total, pred = linear_loss(x, W, p, m, kind, budget)
    gx, gw = torch.autograd.grad(0.7 * total, (x, W))
    ref, ref_pred = reference_loss(lambda h: h @ W.T, x, p, m, kind, budget)
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
        total, _ = linear_loss(x, W, p, m, budget=2 * 300 * 8)
        ref, _ = reference_loss(lambda h: h @ W.T, x, p, m, budget=2 * 300 * 8)
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
        total, pred = linear_loss(x, W, p, m)
    ref, ref_pred = reference_loss(lambda h: h @ W.T, x.detach(), p, m)
    assert not total.requires_grad
    torch.testing.assert_close(total, ref.detach(), rtol=1e-6, atol=1e-5)
    assert torch.equal(pred, ref_pred)


def test_loss_definitions_on_a_worked_example():
    """p = (0.5, 0.3, 0.2), q = softmax(z) = (0.2, 0.2, 0.6): kl = -sum p log q, ce = -log q_0 (the target's
    argmax), lk = -log sum min(p, q) = -log(0.2 + 0.2 + 0.2)."""
    p = torch.tensor([[[0.5, 0.3, 0.2]]])
    z = torch.tensor([[[0.2, 0.2, 0.6]]]).log()
    expect = {
        "kl": -(p * z).sum().item(),
        "ce": -z[0, 0, 0].item(),
        "lk": -torch.log(torch.tensor(0.6)).item(),
    }
    for kind in LOSSES:
        assert position_loss(kind, z, p).item() == pytest.approx(expect[kind], rel=1e-6), kind


def test_lk_loss_is_minimal_where_the_draft_equals_the_target():
    """alpha = 1 (loss 0) exactly when q = p; a step along -grad raises alpha."""
    p = torch.softmax(torch.randn(1, 4, 20, generator=torch.Generator().manual_seed(1)), -1)
    assert position_loss("lk", p.log(), p).abs().max() < 1e-6
    z = torch.zeros(1, 4, 20, requires_grad=True)
    loss = position_loss("lk", z, p).sum()
    (g,) = torch.autograd.grad(loss, z)
    assert position_loss("lk", z.detach() - 1.0 * g, p).sum() < loss
