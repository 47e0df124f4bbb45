"""`train.compile` (Eagle3Draft.compile_math): the compiled norms and MLP train exactly as eager ones."""

import torch
from test_train_serve_consistency import make_draft

from eyas.train.ttt import TargetView, ttt_forward


def unroll(compiled: bool):
    d = make_draft(0)
    if compiled:
        d.compile_math()
    g = torch.Generator().manual_seed(1)
    ids, aux = torch.randint(0, 97, (2, 40), generator=g), torch.randn(2, 40, 96, generator=g)
    probs = torch.softmax(torch.randn(2, 40, d.config.draft_vocab_size, generator=g), -1)
    argmax = torch.randint(0, 97, (2, 40), generator=g)
    target = TargetView(probs, argmax, torch.ones_like(argmax, dtype=torch.bool))
    out = ttt_forward(
        d,
        aux,
        ids,
        torch.ones(2, 40),
        torch.zeros(2, 40, dtype=torch.long),
        target,
        ttt_steps=3,
        attention="chunked",
    )
    out.loss.backward()
    return out, {n: p.grad for n, p in d.named_parameters() if p.requires_grad}


def test_compiled_math_trains_as_eager():
    eager, eager_grads = unroll(False)
    comp, comp_grads = unroll(True)
    assert eager.loss.item() > 1.0  # a real loss: every position trained
    torch.testing.assert_close(comp.loss, eager.loss, rtol=1e-6, atol=1e-6)
    assert comp.step_acc == eager.step_acc
    assert eager_grads.keys() == comp_grads.keys() and len(eager_grads) == 13
    for name, grad in eager_grads.items():
        torch.testing.assert_close(comp_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
