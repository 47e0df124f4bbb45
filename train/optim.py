"""The optimizer of `train.optimizer`:

    adamw   torch.optim.AdamW over every trainable parameter (betas 0.9 / 0.95; fused on GPUs)
    muon    torch.optim.Muon (Newton-Schulz orthogonalized momentum) over the draft's hidden 2-D weights
            (fc and the decoder layers' projections), AdamW over the rest (lm_head, the norms): the split
            speculators trains EAGLE-3 drafts with by default (Muon lr 1e-3 wd 0.1 with its update RMS
            matched to AdamW's, AdamW lr 1e-3 wd 0.01)

Both take `train.lr` and `train.weight_decay` (Muon's own decay: `train.muon_weight_decay`), and follow one
schedule: `Combined` is one torch Optimizer whose param_groups are those of its members (the same dicts),
so the LR scheduler and accelerate see a single optimizer, and its state_dict saves both for resuming.

torch's Muon orthogonalizes in bf16, which a CPU without bf16 arithmetic (AVX2) runs ~100x slower than
float32 (~30 s a step for a SmolLM2-sized draft on 2 cores); there `Muon` does that one iteration in float32.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.optim._muon as torch_muon

from eyas.data.target import cpu_bf16_runs

# 2-D, but the input / output layers: AdamW, as Muon's authors do; and P-EAGLE's mask_hidden (1, n_aux * H_t),
# a learned input vector, not a matrix (orthogonalising one row would only fix its norm)
HIDDEN_SKIP = ("lm_head", "embed_tokens", "mask_hidden")


class Combined(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, stepped together."""

    def __init__(self, members: list[torch.optim.Optimizer]):
        self.members = members
        groups = [g for m in members for g in m.param_groups]
        super().__init__([{"params": []}], {})
        self.param_groups = groups  # the members' own dicts: a scheduler's lr reaches them
        self.state = {}  # each member keeps its own; state_dict below gathers them

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for m in self.members:
            m.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for m in self.members:
            m.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"members": [m.state_dict() for m in self.members]}

    def load_state_dict(self, state: dict) -> None:
        for m, s in zip(self.members, state["members"], strict=True):
            m.load_state_dict(s)
        # a torch optimizer's load_state_dict makes new group dicts: share them again, or the schedule sets lr
        # on dead dicts (accelerate's prepare loads the state back to place it on the device: Muon then ran at
        # the first warmup step's lr for the whole run)
        self.param_groups = [g for m in self.members for g in m.param_groups]


def newton_schulz_fp32(grad: torch.Tensor, ns_coefficients: tuple, ns_steps: int, eps: float) -> torch.Tensor:
    """torch Muon's quintic Newton-Schulz orthogonalization of a 2-D update (A, B), in float32 rather than
    bf16: X = G / |G| (its wide side as rows), then ns_steps of X <- aX + (bXX^T + c(XX^T)^2)X -> (A, B)."""
    a, b, c = ns_coefficients
    x = grad.float()
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


@contextmanager
def cpu_float32_orthogonalization():
    """torch Muon's step with its orthogonalization of CPU tensors in float32 (`newton_schulz_fp32`) where the
    CPU has no bf16 arithmetic (data/target.py `cpu_bf16_runs`, which says so once); as it is elsewhere."""
    bf16 = torch_muon._zeropower_via_newtonschulz

    def orthogonalize(grad, *args):
        if grad.device.type == "cpu" and not cpu_bf16_runs(grad.device, "Muon's orthogonalization (bf16)"):
            return newton_schulz_fp32(grad, *args)
        return bf16(grad, *args)

    torch_muon._zeropower_via_newtonschulz = orthogonalize
    try:
        yield
    finally:
        torch_muon._zeropower_via_newtonschulz = bf16


class Muon(torch.optim.Muon):
    """torch.optim.Muon, orthogonalizing in float32 on a CPU without bf16 arithmetic."""

    @torch.no_grad()
    def step(self, closure=None):
        with cpu_float32_orthogonalization():
            return super().step(closure)


def muon_params(named: list[tuple[str, torch.nn.Parameter]]) -> list[torch.nn.Parameter]:
    """The parameters `train.optimizer: muon` gives Muon: the hidden 2-D weights (fc, the decoder layers'
    projections); AdamW takes the rest."""
    return [p for n, p in named if p.ndim == 2 and not any(s in n for s in HIDDEN_SKIP)]


def make_optimizer(
    name: str,
    named: list[tuple[str, torch.nn.Parameter]],
    lr: float,
    weight_decay: float,
    muon_wd: float,
    fused: bool,
) -> torch.optim.Optimizer:
    """`train.optimizer` over the trainable (name, parameter) pairs."""
    adamw = dict(lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95), fused=fused)  # fused: one kernel/step
    if name == "adamw":
        return torch.optim.AdamW([p for _, p in named], **adamw)
    hidden = muon_params(named)
    ids = {id(p) for p in hidden}
    rest = [p for _, p in named if id(p) not in ids]
    # match_rms_adamw: the update's RMS scaled to AdamW's (0.2 sqrt(max(A, B))), so one lr serves both groups,
    # as speculators sets it (torch's own default, "original", leaves Muon's steps far smaller at an AdamW lr)
    members = [Muon(hidden, lr=lr, weight_decay=muon_wd, adjust_lr_fn="match_rms_adamw")]
    return Combined(members + ([torch.optim.AdamW(rest, **adamw)] if rest else []))
