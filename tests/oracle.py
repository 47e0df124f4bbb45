"""An engine whose drafts are rewritten to hit the target's true continuation at chosen rates, so
that tests see every acceptance length and every tree branch being the accepted one.

The real draft still runs (its forwards and cache bookkeeping are the engine's own); only the
proposed tokens are replaced afterwards: a child of a node on the true branch carries the true
next token with probability 1 - p_wrong (at most one child per node, so the true child may be the
first, a later sibling or none); every other node carries a wrong token.
"""

import random

import torch

from eyas.serve.decoding.engine import Engine


class OracleEngine(Engine):
    def __init__(self, *args, truth: dict[str, list[int]], p_wrong: float, seed: int = 0, **kw):
        super().__init__(*args, **kw)
        self.truth, self.p_wrong, self.rng = truth, p_wrong, random.Random(seed)
        propose = self._propose  # the draft kind's own proposal (a tree of forwards, or parallel drafts)
        self._propose = lambda n, n_max, B: self._rewrite(propose(n, n_max, B), B)

    def _rewrite(self, tree, B):
        tokens = tree.tokens.tolist()
        parents, depth = tree.parents.tolist(), tree.depth.tolist()
        for b in range(B):
            full = self.truth[self.rows[b].id]  # prompt + the target's own output
            base = self.n[b]  # the root is x_base
            on_path, taken = {0}, set()
            for i in range(1, len(tokens[b])):
                d, par = depth[b][i], parents[b][i]
                true = full[base + d] if base + d < len(full) else 3
                if par in on_path and par not in taken and self.rng.random() >= self.p_wrong:
                    tokens[b][i] = true  # the true branch goes on through this child
                    on_path.add(i)
                    taken.add(par)
                else:
                    tokens[b][i] = (
                        true + 1 + self.rng.randrange(self.vocab - 1)
                    ) % self.vocab  # never `true`
        tree.tokens = torch.tensor(tokens, device=tree.tokens.device)
        return tree
