"""Sampling parameters as vLLM applies them, and lossless verification of drafted trees.

Target distribution of a row (vLLM v1 `Sampler` / `RejectionSampler`, the PyTorch path):

    temperature < 1e-5   greedy: argmax of the raw logits
    otherwise            logits / temperature -> top-k (every token tied with the k-th value is
                         kept; 0 or -1 = off) -> top-p (ascending sort, drop the prefix whose
                         cumulative probability <= 1 - p, the most probable token always kept)
                         -> softmax. A token is drawn by the exponential race argmax(p / E),
                         E ~ Exp(1), from the request's own generator when it has a seed.

Verification of a tree (a chain is a tree with one child per node), per row, from the root:

    greedy     follow the child whose token is the target's argmax at the current node; the
               next token is the argmax at the last accepted node.
    sampling   speculative sampling with q one-hot (the drafter proposes deterministically: the
               argmax for a chain, the top-k for a tree, as EAGLE, SGLang and vLLM do). At node u
               with target distribution r (= p_u), try its children in decreasing draft score:
               accept child c with probability min(1, r(c) / q(c)) = r(c) / sum(r); on rejection
               r <- max(0, r - q) = r with c removed (renormalisation is implicit: acceptance
               uses r(c) / sum(r), the race argmax(r / E) ignores scale). An accepted child
               continues the walk with r = p_c; when no child is accepted (or u has none) the
               next token is drawn from r. Each emitted token is then distributed exactly as the
               target's p: P(c_1) = p(c_1), P(c_2) = (1 - p(c_1)) p(c_2) / (1 - p(c_1)), ...,
               P(x not tried) = (1 - sum p(c)) p(x) / (1 - sum p(c)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eyas.serve.decoding.tree import Tree

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: below it a temperature means greedy


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int | None = None
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


@dataclass
class RowSampling:
    """The sampling parameters of n rows as tensors, and each row's generator."""

    greedy: torch.Tensor  # (n,) bool
    temperature: torch.Tensor  # (n,) fp32, 1 for greedy rows
    top_k: torch.Tensor  # (n,) long, vocab size where off
    top_p: torch.Tensor  # (n,) fp32
    generators: list[torch.Generator]

    @classmethod
    def of(
        cls, params: list[SamplingParams], generators: list[torch.Generator], vocab: int, device: torch.device
    ) -> RowSampling:
        return cls(
            greedy=torch.tensor([p.greedy for p in params], device=device),
            temperature=torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device),
            top_k=torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device),
            top_p=torch.tensor([p.top_p for p in params], device=device),
            generators=generators,
        )

    @property
    def all_greedy(self) -> bool:
        return bool(self.greedy.all())

    def repeat(self, times: int) -> RowSampling:
        """Each row's parameters for `times` consecutive rows (the nodes of its tree)."""
        r = lambda t: t.repeat_interleave(times)  # noqa: E731
        return RowSampling(r(self.greedy), r(self.temperature), r(self.top_k), r(self.top_p), self.generators)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """vLLM's `apply_top_k_top_p` (PyTorch path): (R, V) logits -> logits with -inf outside."""
    V = logits.shape[-1]
    use_k, use_p = bool((top_k < V).any()), bool((top_p < 1).any())
    if not (use_k or use_p):
        return logits
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if use_k:
        kth = logits_sort.gather(1, (V - top_k.long()).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < kth, -float("inf"))
    if use_p:
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        drop = probs_sum <= 1 - top_p.unsqueeze(1)
        drop[:, -1] = False  # at least one
        logits_sort.masked_fill_(drop, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def target_probs(logits: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """(R, V) raw logits -> (R, V) fp32 probabilities after temperature, top-k and top-p."""
    x = logits.float() / rows.temperature[:, None]
    return apply_top_k_top_p(x, rows.top_k, rows.top_p).softmax(dim=-1)


def exponential_race(weights: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """(n, V) non-negative weights (any scale) -> (n,) one token per row drawn with probability
    proportional to its weight: argmax(w / E), E ~ Exp(1) from the row's generator."""
    e = torch.empty_like(weights, dtype=torch.float32)
    for i, g in enumerate(generators):
        e[i].exponential_(generator=g)
    return (weights.float() / e).argmax(dim=-1)


def sample(logits: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """(n, V) logits -> (n,) next tokens (prefill, and decoding without speculation)."""
    greedy = logits.argmax(dim=-1)
    if rows.all_greedy:
        return greedy
    drawn = exponential_race(target_probs(logits, rows), rows.generators)
    return torch.where(rows.greedy, greedy, drawn)


@dataclass
class Verdict:
    path: torch.Tensor  # (n, S+1) accepted nodes from the root, -1 after the last
    accepted: torch.Tensor  # (n,) draft tokens accepted (path length - 1)
    next_token: torch.Tensor  # (n,) the token after the last accepted node (correction or bonus)


def verify(tree: Tree, logits: torch.Tensor, rows: RowSampling, steps: int) -> Verdict:
    """tree of n rows x N nodes; logits (n, N, V) of the target at every node (node i's logits
    predict the token after node i)."""
    n, N, V = logits.shape
    dev = logits.device
    ar = torch.arange(n, device=dev)
    K = tree.children.shape[-1]
    argmax = logits.argmax(dim=-1)  # (n, N)
    sampling = not rows.all_greedy
    if sampling:
        p = target_probs(logits.reshape(n * N, V), rows.repeat(N)).view(n, N, V)
        u = torch.stack([torch.rand(steps * K, generator=g, device=dev) for g in rows.generators])
        r = p[:, 0].clone()  # the residual at the current node (unnormalised)
    cur = torch.zeros(n, dtype=torch.long, device=dev)
    alive = torch.ones(n, dtype=torch.bool, device=dev)
    path = [cur]
    for level in range(steps):
        moved = torch.zeros(n, dtype=torch.bool, device=dev)
        for j in range(K):
            child = tree.children[ar, cur, j]
            can = alive & ~moved & (child >= 0)
            tok = tree.tokens[ar, child.clamp(min=0)]
            acc = tok == argmax[ar, cur]
            if sampling:
                r_tok = r[ar, tok]
                acc_s = u[:, level * K + j] * r.sum(dim=-1) < r_tok
                acc = torch.where(rows.greedy, acc, acc_s)
                reject = can & ~acc & ~rows.greedy
                r[ar, tok] = torch.where(reject, torch.zeros_like(r_tok), r_tok)
            acc &= can
            cur = torch.where(acc, child, cur)
            moved |= acc
            if sampling:
                r = torch.where(acc[:, None], p[ar, child.clamp(min=0)], r)
        alive &= moved
        path.append(torch.where(alive, cur, torch.full_like(cur, -1)))
    nxt = argmax[ar, cur]
    if sampling:
        nxt = torch.where(rows.greedy, nxt, exponential_race(r, rows.generators))
    path_t = torch.stack(path, dim=1)
    return Verdict(path=path_t, accepted=(path_t >= 0).sum(dim=1) - 1, next_token=nxt)
