"""The optimizer of `train.optimizer`:

    adamw   torch.optim.AdamW over every trainable parameter (betas 0.9 / 0.95; fused on GPUs)
    muon    torch.optim.Muon (Newton-Schulz orthogonalized momentum) over the draft's hidden 2-D weights
            (fc and the decoder layers' projections), AdamW over the rest (lm_head, the norms): the split
            speculators trains EAGLE-3 drafts with by default (Muon lr 1e-3 wd 0.1 with its update RMS
            matched to AdamW's, AdamW lr 1e-3 wd 0.01)

Both take `train.lr` and `train.weight_decay` (Muon's own decay: `train.muon_weight_decay`), and follow one
schedule: `Combined` is one torch Optimizer whose param_groups are those of its members (the same dicts),
so the LR scheduler and accelerate see a single optimizer, and its state_dict saves both for resuming.
"""

from __future__ import annotations

import torch

HIDDEN_SKIP = ("lm_head", "embed_tokens")  # 2-D, but the input / output layers: AdamW, as Muon's authors do


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
    hidden = [p for n, p in named if p.ndim == 2 and not any(s in n for s in HIDDEN_SKIP)]
    ids = {id(p) for p in hidden}
    rest = [p for _, p in named if id(p) not in ids]
    # match_rms_adamw: the update's RMS scaled to AdamW's (0.2 sqrt(max(A, B))), so one lr serves both groups,
    # as speculators sets it (torch's own default, "original", leaves Muon's steps far smaller at an AdamW lr)
    members = [torch.optim.Muon(hidden, lr=lr, weight_decay=muon_wd, adjust_lr_fn="match_rms_adamw")]
    return Combined(members + ([torch.optim.AdamW(rest, **adamw)] if rest else []))
