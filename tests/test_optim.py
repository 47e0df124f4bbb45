"""train.optimizer (train/optim.py): Muon on the draft's hidden matrices, AdamW on the rest, one optimizer to
the schedule; a step moves every trainable tensor."""

import pytest
import torch
from test_train_serve_consistency import make_draft

from eyas.train.optim import Combined, make_optimizer


def test_muon_takes_the_hidden_matrices_adamw_the_rest():
    d = make_draft(0)
    named = [(f"draft.{n}", p) for n, p in d.named_parameters() if p.requires_grad]
    opt = make_optimizer("muon", named, lr=1e-3, weight_decay=0.01, muon_wd=0.1, fused=False)
    assert isinstance(opt, Combined)
    muon, adamw = opt.members
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in named}
    in_muon = sorted(names[id(p)] for g in muon.param_groups for p in g["params"])
    in_adamw = sorted(names[id(p)] for g in adamw.param_groups for p in g["params"])
    assert in_muon == sorted(n for n, p in named if p.ndim == 2 and "lm_head" not in n)
    assert "draft.fc.weight" in in_muon and "draft.lm_head.weight" in in_adamw
    assert sorted(in_muon + in_adamw) == sorted(names.values())
    assert muon.param_groups[0]["weight_decay"] == 0.1 and adamw.param_groups[0]["weight_decay"] == 0.01
    # the schedule sets lr on the combined groups, which are the members' own
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    assert sched.get_last_lr() == [5e-4, 5e-4]
    assert muon.param_groups[0]["lr"] == adamw.param_groups[0]["lr"] == 5e-4
    before = {n: p.detach().clone() for n, p in named}
    for _, p in named:
        p.grad = torch.randn_like(p)
    opt.step()
    assert all(not torch.equal(before[n], p) for n, p in named)
    opt.zero_grad()
    assert all(p.grad is None for _, p in named)


def test_the_schedule_reaches_the_members_after_prepare_and_resume():
    """accelerate's prepare loads the optimizer's state back (device placement), as a resume does; each load
    gives the members new group dicts, which the schedule must still set."""
    from accelerate import Accelerator

    from eyas.train.trainer import lr_lambda

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    opt = make_optimizer("muon", list(model.named_parameters()), 1e-3, 0.01, 0.1, fused=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(100, 4, 0.1))
    model, prepared = Accelerator(cpu=True).prepare(model, opt)
    opt.load_state_dict(opt.state_dict())  # a resume
    for _ in range(10):
        sched.step()
    members = [g["lr"] for m in opt.members for g in m.param_groups]
    assert members == sched.get_last_lr() and members[0] == pytest.approx(1e-3 * lr_lambda(100, 4, 0.1)(10))


@pytest.mark.parametrize("native", [False, True])
def test_muon_orthogonalizes_in_float32_on_a_cpu_without_bf16(native, monkeypatch):
    """torch's Muon runs its Newton-Schulz iteration in bf16, ~100x slower than float32 on an AVX2 CPU: there
    eyas's Muon does it in float32 (within bf16's rounding of torch's), elsewhere exactly torch's step."""
    import torch.optim._muon as torch_muon

    from eyas.data import target as T
    from eyas.train.optim import Muon, newton_schulz_fp32

    monkeypatch.setattr(T, "native_bf16_cpu", lambda: native)
    monkeypatch.setattr(T, "_SAID", set())
    torch_bf16_ns = torch_muon._zeropower_via_newtonschulz
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(48, 32, generator=g)
    coef = torch.optim.Muon([torch.zeros(2, 2)]).defaults["ns_coefficients"]
    ours, torch_bf16 = (
        newton_schulz_fp32(grad, coef, 5, 1e-7),
        torch_muon._zeropower_via_newtonschulz(grad, coef, 5, 1e-7),
    )
    assert ours.dtype == torch.float32 and ours.shape == (48, 32)
    torch.testing.assert_close(ours, torch_bf16.float(), atol=0.02, rtol=0.02)
    w = torch.randn(48, 32, generator=g)
    mine, ref = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    steps = [
        Muon([mine], lr=0.1, adjust_lr_fn="match_rms_adamw"),
        torch.optim.Muon([ref], lr=0.1, adjust_lr_fn="match_rms_adamw"),
    ]
    for p, opt in zip((mine, ref), steps):
        p.grad = grad.clone()
        opt.step()
    # torch's own function is back after the step (the float32 one stands in during eyas's steps only)
    assert torch_muon._zeropower_via_newtonschulz is torch_bf16_ns and torch.equal(mine, ref) == native
    if not native:  # torch's step with the float32 orthogonalization: w (1 - lr wd) - lr 0.2 sqrt(48) X
        expected = w * (1 - 0.1 * 0.1) - 0.1 * 0.2 * 48**0.5 * ours
        torch.testing.assert_close(mine.detach(), expected, atol=1e-5, rtol=1e-5)
