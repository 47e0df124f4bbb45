"""Draft shapes: a chain of k tokens, or an EAGLE-2 dynamic tree, with SGLang's parameters.

    steps             S: tree depth (draft tokens along the longest path)
    topk              K: children expanded per node
    num_draft_tokens  N: tokens the target verifies per row, the root (the last emitted token,
                      not yet in the target's cache) included -- SGLang's count

A chain of k drafts is the tree (S=k, K=1, N=k+1). Building a tree (EAGLE-2, as SGLang's
`select_top_k_tokens` / `organize_draft_results`):

    depth 1    the K most probable draft tokens after the root; score = their draft probability
    depth s+1  each of the K frontier nodes of depth s runs through the draft (its token, its
               parent's output state, position n+s-1) and proposes its K most probable tokens;
               score = parent score x probability; the K best of those K*K become the frontier
    select     the N-1 best of all proposed nodes by score. A child never scores above its parent
               (probabilities <= 1), and ties go to the shallower node, so every chosen node's
               parent is chosen too.

`Tree` holds the chosen nodes in verification order (root first, then by proposal order, a
parent always before its children), their parents, depths and ancestor sets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.recipes.types import TreeShape  # S, K, N as above: a recipe's value type (eval.tree)


@dataclass
class Tree:
    """n rows of N verification nodes each (node 0 = the root)."""

    tokens: torch.Tensor  # (n, N) target token ids (root: the pending token)
    parents: torch.Tensor  # (n, N) parent node, -1 for the root
    depth: torch.Tensor  # (n, N) 0 for the root
    ancestors: torch.Tensor  # (n, N, N) bool: node j is node i or one of its ancestors
    children: torch.Tensor  # (n, N, K) child nodes by decreasing draft score, -1 where none


def ancestor_sets(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """parents (n, N), parents before children -> (n, N, N) ancestor-or-self sets."""
    n, N = parents.shape
    eye = torch.eye(N, dtype=torch.bool, device=parents.device)[None].expand(n, N, N)
    anc = eye.clone()
    for _ in range(max_depth):  # each pass adds one more generation of ancestors
        up = anc.gather(1, parents.clamp(min=0)[:, :, None].expand(n, N, N))
        anc = eye | (up & (parents >= 0)[:, :, None])
    return anc


def select_tree(
    root: torch.Tensor,
    cand_tokens: torch.Tensor,
    cand_scores: torch.Tensor,
    cand_parents: torch.Tensor,
    cand_depth: torch.Tensor,
    shape: TreeShape,
) -> Tree:
    """Keep the N-1 best proposed nodes per row.

    root (n,); cand_* (n, M): every proposed node in proposal order (depth by depth), parents as
    candidate indices (-1: the root)."""
    n, M = cand_tokens.shape
    keep = shape.num_draft_tokens - 1
    # order by score, ties to the shallower node: two stable sorts
    by_depth = torch.sort(cand_depth, dim=1, stable=True).indices
    by_score = torch.sort(cand_scores.gather(1, by_depth), dim=1, descending=True, stable=True).indices
    chosen = by_depth.gather(1, by_score)[:, :keep]
    chosen = torch.sort(chosen, dim=1).values  # proposal order: parents first
    # candidate index -> node index (root = 0)
    node_of = torch.full((n, M), -1, dtype=torch.long, device=root.device)
    node_of.scatter_(1, chosen, torch.arange(1, keep + 1, device=root.device).expand(n, keep))
    cp = cand_parents.gather(1, chosen)
    parent_nodes = torch.where(cp >= 0, node_of.gather(1, cp.clamp(min=0)), torch.zeros_like(cp))
    if (parent_nodes < 0).any():
        raise AssertionError("tree selection dropped a chosen node's parent")
    tokens = torch.cat([root[:, None], cand_tokens.gather(1, chosen)], 1)
    parents = torch.cat([torch.full((n, 1), -1, device=root.device, dtype=torch.long), parent_nodes], 1)
    depth = torch.cat(
        [torch.zeros(n, 1, dtype=torch.long, device=root.device), cand_depth.gather(1, chosen)], 1
    )
    scores = torch.cat([torch.full((n, 1), 2.0, device=root.device), cand_scores.gather(1, chosen)], 1)
    return Tree(
        tokens=tokens,
        parents=parents,
        depth=depth,
        ancestors=ancestor_sets(parents, shape.steps),
        children=children_of(parents, scores, shape.topk),
    )


def children_of(parents: torch.Tensor, scores: torch.Tensor, topk: int) -> torch.Tensor:
    """(n, N, K) each node's children in decreasing score order, -1 padded."""
    n, N = parents.shape
    dev = parents.device
    # sort nodes by (parent, -score); then each parent's children are consecutive
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    order = order.gather(1, torch.sort(parents.gather(1, order), dim=1, stable=True).indices)
    par = parents.gather(1, order)
    first = torch.ones_like(par, dtype=torch.bool)
    first[:, 1:] = par[:, 1:] != par[:, :-1]
    start = torch.cummax(
        torch.where(first, torch.arange(N, device=dev).expand(n, N), torch.zeros_like(par)), 1
    ).values
    rank = torch.arange(N, device=dev)[None] - start  # position among its siblings
    out = torch.full((n, N + 1, topk), -1, dtype=torch.long, device=dev)
    ok = (par >= 0) & (rank < topk)
    row = torch.arange(n, device=dev)[:, None].expand(n, N)
    out[row[ok], par[ok], rank[ok]] = order[ok]
    return out[:, :N]
