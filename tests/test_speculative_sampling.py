"""Speculative sampling leaves the target's output distribution exactly as it is.

The test statistic everywhere: Pearson's chi-square between the observed counts of every possible
output (a tiny vocabulary lets us enumerate them) and the exact target probabilities computed by
enumeration, cells with expected count < 5 pooled; the check fails when the p-value < 1e-3.
Power is shown, not assumed: each test runs the same statistic on a deliberately wrong verifier
(sampling the correction from p instead of the residual p - q, the classic mistake) and asserts
that it is rejected. The runs are seeded, so each test is deterministic.

  * kernel: `verify` on one tree with known target distributions at its nodes, 60,000 rows at once;
    the emitted sequence (accepted path + next token) must follow the target's own sequential
    sampling: y1 ~ p_root, and while y_i is a child of the current node, y_{i+1} ~ p_{y_i}.
  * engine: 6,000 requests (each with its own seed) through the continuous-batching loop, chain and
    tree, temperature 1 and 0.8 with top-k / top-p: their 2 or 3 generated tokens vs the target's
    exact distribution of the first 2 or 3 tokens, enumerated with the target itself. Proposals
    are the target's own most probable tokens so that drafts are accepted at every level.
"""

import math

import pytest
import torch
from data_fixtures import one_thread  # noqa: F401
from tiny_targets import draft_for, tiny_gpt_oss

from eyas.recipes.types import TreeShape
from eyas.serve.decoding import sampling as S
from eyas.serve.decoding.engine import Engine, Request
from eyas.serve.decoding.sampling import RowSampling, SamplingParams, target_probs, verify
from eyas.serve.decoding.tree import Tree, ancestor_sets, children_of

pytestmark = pytest.mark.usefixtures("one_thread")
ALPHA = 1e-3


def chi_square_p(counts: dict, probs: dict, n: int) -> float:
    """Pearson chi-square p-value of observed `counts` against exact `probs` (cells with expected < 5
    pooled); 0 when an output of probability 0 was observed."""
    assert abs(sum(probs.values()) - 1) < 1e-6
    if set(counts) - set(probs):
        return 0.0
    stat, df, pool_e, pool_o = 0.0, -1, 0.0, 0
    for cell, p in probs.items():
        e, o = n * p, counts.get(cell, 0)
        if e < 5:
            pool_e, pool_o = pool_e + e, pool_o + o
            continue
        stat += (o - e) ** 2 / e
        df += 1
    if pool_e > 0:
        stat += (pool_o - pool_e) ** 2 / pool_e
        df += 1
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


@pytest.fixture
def wrong_correction(monkeypatch):
    """The classic mistake: after a rejection, draw the correction from p instead of the residual."""

    def install():
        real = S.verify

        def broken(tree, logits, rows, steps):
            v = real(tree, logits, rows, steps)
            n, N, V = logits.shape
            ar = torch.arange(n)
            last = v.path.gather(1, v.accepted[:, None])[:, 0]
            p = target_probs(logits[ar, last], rows)
            v.next_token = S.exponential_race(p, rows.generators)
            return v

        monkeypatch.setattr(S, "verify", broken)
        import eyas.serve.decoding.engine as E

        monkeypatch.setattr(E, "verify", broken)

    return install


# ---------------------------------------------------------------------------- the kernel


def small_tree():
    """root -> {a=1, b=2, c=3}; a -> {d=4, e=0}; d -> {f=5}   (node ids in verification order)."""
    tokens = torch.tensor([[7, 1, 2, 3, 4, 0, 5]])
    parents = torch.tensor([[-1, 0, 0, 0, 1, 1, 4]])
    depth = torch.tensor([[0, 1, 1, 1, 2, 2, 3]])
    scores = torch.tensor([[2.0, 0.5, 0.3, 0.2, 0.3, 0.1, 0.2]])
    return tokens, parents, depth, scores


def expected_sequences(tokens, parents, probs):
    """Exact distribution of the emitted sequence under the target's own sequential sampling."""
    kids = {}
    for i, par in enumerate(parents):
        if par >= 0:
            kids.setdefault(par, {})[tokens[i]] = i
    out = {}

    def walk(node, prefix, pr):
        for x, px in enumerate(probs[node]):
            if px == 0:
                continue
            if x in kids.get(node, {}):
                walk(kids[node][x], prefix + (x,), pr * px)
            else:
                out[prefix + (x,)] = out.get(prefix + (x,), 0) + pr * px

    walk(0, (), 1.0)
    return out


def test_verify_kernel_distribution(wrong_correction):
    tokens, parents, depth, scores = small_tree()
    V, n = 8, 60000
    g = torch.Generator().manual_seed(0)
    logits1 = torch.randn(1, 7, V, generator=g) * 1.5
    params = [SamplingParams(temperature=0.9, top_k=6, top_p=0.95, seed=i) for i in range(n)]
    tree = Tree(
        tokens=tokens.expand(n, -1),
        parents=parents.expand(n, -1),
        depth=depth.expand(n, -1),
        ancestors=ancestor_sets(parents, 3).expand(n, -1, -1),
        children=children_of(parents, scores, 3).expand(n, -1, -1),
    )

    def run():
        gens = [torch.Generator().manual_seed(i) for i in range(n)]
        rows = RowSampling.of(params, gens, V, torch.device("cpu"))
        v = S.verify(tree, logits1.expand(n, -1, -1), rows, steps=3)
        seqs = {}
        for path, a, nxt in zip(v.path.tolist(), v.accepted.tolist(), v.next_token.tolist()):
            seq = tuple(tokens[0, path[i]].item() for i in range(1, a + 1)) + (nxt,)
            seqs[seq] = seqs.get(seq, 0) + 1
        return seqs

    p = target_probs(logits1[0], RowSampling.of(params[:7], [None] * 7, V, torch.device("cpu"))).tolist()
    exact = expected_sequences(tokens[0].tolist(), parents[0].tolist(), p)
    assert run() == run(), "per-row seeds: the same seeds give the same outputs"
    assert chi_square_p(run(), exact, n) > ALPHA
    wrong_correction()
    assert chi_square_p(run(), exact, n) < ALPHA, "the test has no power against a wrong correction"


def test_greedy_rows_follow_argmax():
    tokens, parents, depth, scores = small_tree()
    logits = torch.full((1, 7, 8), -5.0)
    logits[0, 0, 1] = 3  # root -> a ; a -> d ; d -> 6 (not a child: the bonus)
    logits[0, 1, 4] = 3
    logits[0, 4, 6] = 3
    tree = Tree(tokens, parents, depth, ancestor_sets(parents, 3), children_of(parents, scores, 3))
    rows = RowSampling.of([SamplingParams(temperature=0)], [torch.Generator()], 8, torch.device("cpu"))
    v = verify(tree, logits, rows, steps=3)
    assert v.path.tolist() == [[0, 1, 4, -1]] and v.accepted.tolist() == [2] and v.next_token.tolist() == [6]


def test_vllm_top_k_top_p():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.5, -1.0]])
    V = 6
    k2 = S.apply_top_k_top_p(logits.clone(), torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isfinite(k2).tolist() == [[False, True, False, True, False, False]]
    k3 = S.apply_top_k_top_p(logits.clone(), torch.tensor([3]), torch.tensor([1.0]))
    assert torch.isfinite(k3).sum() == 3
    # top-p 0.5 over softmax: the two tied 3.0 tokens hold 0.61 together; each alone 0.30 < 0.5
    p = torch.softmax(logits, -1)
    kept = S.apply_top_k_top_p(logits.clone(), torch.tensor([V]), torch.tensor([0.5]))
    assert torch.isfinite(kept).sum() == 2 and p[0, [1, 3]].sum() > 0.5
    one = S.apply_top_k_top_p(logits.clone(), torch.tensor([V]), torch.tensor([1e-6]))
    assert torch.isfinite(one).sum() == 1  # at least one token always survives


# ---------------------------------------------------------------------------- the engine


class RankedEngine(Engine):
    """Proposes the target's own most probable tokens at every tree node (a perfect drafter whose
    proposals are deterministic, which is all lossless verification assumes), so drafts are
    accepted often and every tree level is verified. The real draft still runs underneath."""

    def __init__(self, *a, dist, **kw):
        super().__init__(*a, **kw)
        self.dist = dist

    def _propose(self, n, n_max, B):
        tree = super()._propose(n, n_max, B)
        tokens, kids = tree.tokens.tolist(), tree.children.tolist()
        for b in range(B):

            def fill(node, prefix):
                ranked = sorted(range(self.vocab), key=lambda x: -self.dist(prefix)[x])
                for rank, child in enumerate(c for c in kids[b][node] if c >= 0):
                    tokens[b][child] = ranked[rank]
                    fill(child, prefix + (ranked[rank],))

            fill(0, tuple(self.rows[b].prompt + self.rows[b].tokens))
        tree.tokens = torch.tensor(tokens)
        return tree


def target_dist(target, params):
    """prefix -> the target's next-token distribution after temperature / top-k / top-p (memoised)."""
    V = target.config.vocab_size
    memo = {}

    def dist(prefix):
        if prefix not in memo:
            with torch.no_grad():
                logits = target(torch.tensor([list(prefix)])).logits[0, -1:]
            memo[prefix] = target_probs(logits, RowSampling.of([params], [None], V, torch.device("cpu")))[
                0
            ].tolist()
        return memo[prefix]

    return dist


def sequence_distribution(dist, prompt, m):
    """Exact P(x1..xm) of the target's own sampling, by enumeration."""
    out = {}

    def walk(prefix, pr, depth):
        if depth == m:
            out[prefix] = pr
            return
        for x, px in enumerate(dist(tuple(prompt) + prefix)):
            if px > 0:
                walk(prefix + (x,), pr * px, depth + 1)

    walk((), 1.0, 0)
    return out


@pytest.mark.parametrize(
    "shape,params",
    [
        (TreeShape.chain(2), SamplingParams(temperature=1.0, max_tokens=2)),
        (TreeShape.chain(3), SamplingParams(temperature=0.8, top_k=4, max_tokens=3)),
        (TreeShape(2, 3, 6), SamplingParams(temperature=1.0, top_k=4, max_tokens=3)),
        (TreeShape(2, 3, 6), SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_tokens=3)),
    ],
)
def test_engine_output_distribution(shape, params, wrong_correction):
    target = tiny_gpt_oss(seed=7, layers=3, hidden=32, vocab=12, window=4, experts=2, heads=2, kv=1)
    draft = draft_for(target, 7)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    dist = target_dist(target, params)
    exact = sequence_distribution(dist, prompt, params.max_tokens)
    n = 6000

    def run():
        eng = RankedEngine(target, draft, shape, max_batch=1000, dist=dist)
        reqs = [Request(prompt, SamplingParams(**{**params.__dict__, "seed": i})) for i in range(n)]
        eng.run(reqs)
        counts = {}
        for r in reqs:
            counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
        accepted = sum(a for r in reqs for a in r.accepted)
        assert accepted > n // 3, accepted  # drafts were accepted, not only corrected
        return counts

    assert chi_square_p(run(), exact, n) > ALPHA
    wrong_correction()
    assert chi_square_p(run(), exact, n) < ALPHA, "the test has no power against a wrong correction"


def chain_expectation(tree: Tree, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain's accepted drafts at a verification, by the lossless rule with a one-hot q: the first j are
    accepted with probability P_j = prod_{i<=j} p_{i-1}(d_i) (p (n, N, V): the target's probabilities at
    each node; d_i: node i's token). -> (E[a], Var[a]) per row: E = sum_j P_j, E[a^2] = sum_j (2j - 1) P_j."""
    step = p[:, :-1].gather(-1, tree.tokens[:, 1:, None]).squeeze(-1)  # (n, S): p_{i-1}(d_i)
    P = step.double().cumprod(-1)
    j = torch.arange(1, P.shape[1] + 1, dtype=torch.float64)
    mean = P.sum(-1)
    return mean, ((2 * j - 1) * P).sum(-1) - mean**2


def sharper(p: torch.Tensor) -> torch.Tensor:
    """p squared, renormalised: the wrong acceptance rule the T = 1 test must detect."""
    q = p**2
    return q / q.sum(-1, keepdim=True)


def t1_rounds(target, draft, k: int, prompts: list, seeds: range, verify_fn, monkeypatch) -> torch.Tensor:
    """Every round of requests (prompt s % len(prompts), seed s, T = 1, 160 tokens, all in flight) with the
    loop's verify replaced by `verify_fn` -> (rounds, 3): accepted drafts, their expectation and variance
    under the lossless rule (from the verification's own logits); z_of sums them."""
    import eyas.serve.decoding.engine as E

    seen = []

    def recording(tree, logits, rows, steps):
        n, N, V = logits.shape
        mean, var = chain_expectation(
            tree, target_probs(logits.reshape(n * N, V), rows.repeat(N)).view(n, N, V)
        )
        out = verify_fn(tree, logits, rows, steps)
        seen.append(torch.stack([out.accepted.double(), mean, var], 1))
        return out

    monkeypatch.setattr(E, "verify", recording)
    requests = [
        Request(prompts[s % len(prompts)], SamplingParams(temperature=1.0, max_tokens=160, seed=s))
        for s in seeds
    ]
    eng = Engine(target, draft, TreeShape.chain(k), max_batch=len(requests))
    eng.run(requests)
    eng.close()
    return torch.cat(seen)


def z_of(rounds: torch.Tensor) -> float:
    """Realized minus expected accepted drafts over the square root of the summed variances."""
    real, mean, var = rounds.sum(0)
    return float((real - mean) / var.sqrt())


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_t1_acceptance_adds_up_to_its_expectation_in_the_loop(demo_run, monkeypatch, k):
    """At T = 1 the loop accepts a chain's first j drafts with probability prod_{i<=j} p_{i-1}(d_i)
    (speculative sampling with the drafter's one-hot q), so over every round of the demo draft on the demo
    target (its 32 held-out prompts, 160 tokens each, all in flight) the accepted drafts add up to the sum
    of those expectations, computed from each verification's own logits: |z| < 4 for k = 1..5 (z: realized
    minus expected total over the square root of the summed variances). The power: a verifier that accepts by
    a sharper p (p squared, renormalised; what a fault in the T = 1 loop's acceptance would show, as against
    noise in tau(k)) stands about 4 standard deviations off at that many requests. How many is what the
    statistic needs, not a draft's quality: each prompt runs with more seeds until the sharper rule's |z|
    passes 4 (at most 8 seeds), and the lossless rule is tested on as many requests with other seeds (the
    seeds that stopped the growth would lean its draws; on them the sharper rule's |z| is expected near 4,
    not certainly past it).
    Measured on the AVX2-only EPYC: its demo draft (0.65 drafts expected a round at k = 2) took 32 requests at
    every k, the sharper rule's z +4.2 to +6.4, the lossless rule's -2.2 to +0.9; a 1-epoch draft of it (0.43
    at k = 2, weaker than the AMX Xeon's 0.58, which failed the former fixed precondition of 0.6) took 32, 64,
    96, 224 and 128 requests for k = 1..5, the sharper rule's z +4.0 to +6.9, the lossless rule's -1.6 to
    +1.4 (at a fixed 64 requests the sharper rule's z was 3.9 and 3.6 at k = 4, 5: too few).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eyas.data.chat import render_prompt
    from eyas.data.target import resolve_path
    from eyas.eval.benchmarks import held_out
    from eyas.infra import layout
    from eyas.train.checkpoint import load_draft_beside

    target = AutoModelForCausalLM.from_pretrained(resolve_path("eyas-demo"), dtype=torch.float32).eval()
    draft = load_draft_beside(layout.run_checkpoint(demo_run), target)
    tok = AutoTokenizer.from_pretrained(resolve_path("eyas-demo"))
    prompts = [render_prompt(tok, m) for m in held_out(demo_run, 32).messages]

    def faulty(tree, logits, rows, steps):
        monkeypatch.setattr(S, "target_probs", lambda logits, rows: sharper(target_probs(logits, rows)))
        try:
            return verify(tree, logits, rows, steps)
        finally:
            monkeypatch.setattr(S, "target_probs", target_probs)

    cap, n, wrong = 8 * len(prompts), 0, torch.zeros(0, 3, dtype=torch.float64)
    while n < cap and (n == 0 or abs(z_of(wrong)) <= 4):
        # z grows as the square root of the requests: as many more as it seems to need, whole prompt sets
        want = len(prompts) if n == 0 else n * (4.5 / max(abs(z_of(wrong)), 1.0)) ** 2 - n
        more = min(cap - n, len(prompts) * max(1, math.ceil(want / len(prompts))))
        wrong = torch.cat(
            [wrong, t1_rounds(target, draft, k, prompts, range(n, n + more), faulty, monkeypatch)]
        )
        n += more
    z_faulty = z_of(wrong)
    print(f"k={k}: z = {z_faulty:+.2f} with the sharper p over {n} requests")
    assert abs(z_faulty) > 4, f"the test has no power against a wrong acceptance rule with {n} requests"
    rounds = t1_rounds(
        target, draft, k, prompts, range(cap, cap + n), verify, monkeypatch
    )  # seeds not used above
    z = z_of(rounds)
    print(f"k={k}: z = {z:+.2f}; {len(rounds)} rounds, {rounds[:, 1].mean():.3f} drafts expected a round")
    assert abs(z) < 4
