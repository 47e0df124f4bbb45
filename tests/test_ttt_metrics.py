"""TTT's acceptance counts, greedy and at temperature 1 (train/ttt.py's docstring):

* at T = 1 each step's counts are sum_i w_j(i) and sum_i w_j(i) p_j(c_j), with c_j the draft's argmax,
  p_j the target's full-vocabulary probability and w_j the weight of reaching step j along the captured
  tokens (times prod p unless the text is the target's T = 1 samples): checked against a per-chain walk
  written out here, packed rows and padding included;
* on text sampled from the target at T = 1 the estimate is unbiased: over many sampled texts its mean is
  the exact expected acceptance, where the weighting for greedy text would be biased;
* a one-hot target (greedy captures) makes the T = 1 counts the greedy counts exactly;
* the teacher's views carry the full softmax's mass in the draft vocab (final states and top-k).
"""

import pytest
import torch
from test_train_serve_consistency import make_draft
from test_ttt_attention import packed_docs

from eyas.train.ttt import TargetView, target_view, topk_view, ttt_forward


def mapped(d):
    """The draft vocab = the odd target ids 1, 3, ..., 79 (target vocab 97)."""
    d2t = torch.arange(40)  # draft id i -> target id i + d2t[i] = 2i + 1
    t2d = torch.zeros(97, dtype=torch.bool)
    t2d[2 * torch.arange(40) + 1] = True
    d.set_vocab_map(d2t + 1, t2d)
    return d


def to_draft_ids(d):
    """(97,) the draft id of each target id in the draft vocab, 0 elsewhere."""
    to_draft = torch.zeros(97, dtype=torch.long)
    to_draft[d.to_target_ids(torch.arange(40))] = torch.arange(40)
    return to_draft


def draft_target(d, B, T, g, one_hot=False):
    """A target whose argmax is in the draft vocab at ~80% of positions; mass < 1 unless one_hot."""
    probs = torch.softmax(torch.randn(B, T, 40, generator=g) * (50 if one_hot else 2), -1)
    if one_hot:
        probs = torch.nn.functional.one_hot(probs.argmax(-1), 40).float()
    in_draft = torch.rand(B, T, generator=g) > 0.2
    argmax = torch.where(in_draft, d.to_target_ids(probs.argmax(-1)), torch.full((B, T), 96))
    mass = torch.ones(B, T) if one_hot else 0.5 + 0.5 * torch.rand(B, T, generator=g)
    return TargetView(probs, argmax, in_draft, mass)


def walk(d, out, ids, mask, doc, target, steps, sampled_text=False):
    """The T = 1 counts chain by chain: (base, right) per step."""
    B, T = ids.shape
    base, right = [0.0] * steps, [0.0] * steps
    for b in range(B):
        for i in range(T):
            w = 1.0
            for j in range(steps):
                if i + 2 + j >= T:
                    break
                c = int(out.logits[j][b, i].argmax())
                p = float(target.probs[b, i + 1 + j, c] * target.mass[b, i + 1 + j])
                if mask[b, i + 2 + j] and doc[b, i + 2 + j] == doc[b, i]:
                    base[j] += w
                    right[j] += w * p
                on_text = float(int(d.to_target_ids(torch.tensor(c))) == int(ids[b, i + 2 + j]))
                w *= on_text if sampled_text else p * on_text
    return base, right


def token_blind(seed):
    """A draft whose guesses do not depend on the tokens fed (zero embeddings), so a test can write the
    captured text from them and know which chains follow it."""
    d = mapped(make_draft(seed))
    with torch.no_grad():
        d.embed_tokens.weight.zero_()
    return d


def guesses(d, aux, ids, mask, doc, target, steps):
    """Each step's draft argmax as target ids: [(B, T)] per step, guess j at index i is of x_{i+2+j}."""
    with torch.no_grad():
        out = ttt_forward(d, aux, ids, mask, doc, target, steps, keep_logits=True)
    return [d.to_target_ids(x.argmax(-1)) for x in out.logits]


@pytest.mark.parametrize("seed,sampled_text", [(0, False), (1, False), (2, True)])
def test_t1_counts_are_the_chains_acceptance_probabilities(seed, sampled_text):
    d = token_blind(seed)
    g = torch.Generator().manual_seed(seed)
    B, T, steps = 2, 23, 4
    target = draft_target(d, B, T, g)
    ids = torch.randint(0, 97, (B, T), generator=g)
    aux = torch.randn(B, T, 96, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    doc = packed_docs(B, T, g)
    guess = guesses(d, aux, ids, mask, doc, target, steps)
    for i in range(0, T - 2 - steps, steps + 1):  # chains that follow the captured text (up to a boundary)
        for j in range(steps):
            ids[:, i + 2 + j] = guess[j][:, i]
    with torch.no_grad():
        out = ttt_forward(d, aux, ids, mask, doc, target, steps, keep_logits=True, sampled_text=sampled_text)
    base, right = walk(d, out, ids, mask, doc, target, steps, sampled_text)
    assert out.step_sampled_base == pytest.approx(base, rel=1e-5, abs=1e-6)
    assert out.step_sampled_right == pytest.approx(right, rel=1e-5, abs=1e-6)
    assert base[0] == out.step_count[0]  # step 0: every counted index, weight 1
    assert all(0 < r < b for r, b in zip(right, base)), (base, right)  # chains reach every step


def test_one_hot_target_makes_t1_counts_the_greedy_counts():
    d = token_blind(3)
    g = torch.Generator().manual_seed(3)
    B, T, steps = 2, 21, 4
    ids = torch.randint(0, 97, (B, T), generator=g)
    aux = torch.randn(B, T, 96, generator=g)
    mask, doc = torch.ones(B, T), torch.zeros(B, T, dtype=torch.long)
    target = draft_target(d, B, T, g, one_hot=True)
    # the target agrees with the draft's step-0 guess at ~70% of positions; the text is greedy
    guess = guesses(d, aux, ids, mask, doc, target, steps)[0]  # (B, T) of x_{i+2}, i.e. z_{i+1}
    agree = torch.rand(B, T - 1, generator=g) < 0.7
    argmax = torch.where(agree, guess[:, : T - 1], target.argmax[:, 1:])
    target.argmax[:, 1:] = argmax
    target.in_draft = d.t2d[target.argmax]
    draft_ids = to_draft_ids(d)[target.argmax]
    target.probs = torch.nn.functional.one_hot(draft_ids, 40).float() * target.in_draft[..., None]
    ids[:, 1:] = target.argmax[:, :-1]
    with torch.no_grad():
        out = ttt_forward(d, aux, ids, mask, doc, target, steps)
    assert out.step_cond_right[0] > 0 and out.step_cond_base[1] > 0
    assert out.step_sampled_base == [float(x) for x in out.step_cond_base]
    assert out.step_sampled_right == [float(x) for x in out.step_cond_right]


def test_target_views_carry_the_mass_in_the_draft_vocab():
    d = mapped(make_draft(4))
    g = torch.Generator().manual_seed(4)
    final, W = torch.randn(2, 5, 24, generator=g), torch.randn(97, 24, generator=g)
    view = target_view(final, W, d, chunk=3)
    full = torch.softmax(final @ W.T, -1)  # (2, 5, 97)
    in_vocab = full[..., d.to_target_ids(torch.arange(40))]
    torch.testing.assert_close(view.probs * view.mass[..., None], in_vocab, rtol=1e-5, atol=1e-7)
    assert bool((view.mass < 1).all())
    # top-k: the stored log-probabilities of the draft-vocab entries, the rest of the mass dropped
    top = full.topk(6, -1)
    tv = topk_view(top.indices, top.values.log(), d)
    inside = d.t2d[top.indices]  # (2, 5, 6) bool
    torch.testing.assert_close(tv.mass, (top.values * inside).sum(-1), rtol=1e-5, atol=1e-7)
    to_draft = to_draft_ids(d)
    got = (tv.probs * tv.mass[..., None]).gather(-1, to_draft[top.indices])
    torch.testing.assert_close(got * inside, top.values * inside, rtol=1e-5, atol=1e-7)


def test_t1_estimate_on_sampled_text_is_the_expected_acceptance():
    """A token-blind draft and a target whose distributions do not depend on the text: a chain from index i
    is accepted through step j with probability prod_{l<=j} p_l(c_l) whatever is sampled. Texts drawn from
    the target: the mean of the sampled-text counts is that sum (within 4 standard errors of the 600 draws,
    deterministic under the seed); the greedy-text weighting (p once more per step) lands far below it."""
    d = token_blind(5)
    g = torch.Generator().manual_seed(5)
    B, T, steps, draws = 1, 14, 3, 600
    target = draft_target(d, B, T, g)
    aux = torch.randn(B, T, 96, generator=g)
    mask, doc = torch.ones(B, T), torch.zeros(B, T, dtype=torch.long)
    ids = torch.zeros(B, T, dtype=torch.long)
    guess = guesses(d, aux, ids, mask, doc, target, steps)  # the same for every text
    # a target that often agrees with the draft's guesses, so that chains go on
    to_draft = to_draft_ids(d)
    logits = torch.randn(B, T, 40, generator=g)
    for j in range(steps):  # step j at index i guesses position i+1+j's distribution
        logits[:, 1 + j : T - 1, :].scatter_(-1, to_draft[guess[j][:, : T - 2 - j]][..., None], 5.0)
    target.probs, target.mass = torch.softmax(logits, -1), torch.ones(B, T)
    p = [
        target.probs[0, 1 + j : T - 1].gather(-1, to_draft[guess[j][0, : T - 2 - j]][..., None])[:, 0]
        for j in range(steps)
    ]
    exact = [
        sum(torch.stack([p[m][i] for m in range(j + 1)]).prod() for i in range(T - 2 - j)).item()
        for j in range(steps)
    ]
    got = {True: [], False: []}
    with torch.no_grad():
        for _ in range(draws):
            draft_ids = torch.multinomial(target.probs[0], 1, generator=g)[:, 0]  # (T,) x_{t+1} ~ p_t
            ids[0, 1:] = d.to_target_ids(draft_ids[:-1])
            for sampled_text in (True, False):
                out = ttt_forward(d, aux, ids, mask, doc, target, steps, sampled_text=sampled_text)
                got[sampled_text].append(out.step_sampled_right)
    runs = torch.tensor(got[True])  # (draws, steps)
    mean, se = runs.mean(0), runs.std(0) / draws**0.5
    for j in range(steps):
        assert abs(mean[j].item() - exact[j]) < 4 * se[j].item() + 1e-5, (j, mean[j].item(), exact[j])
        assert se[j].item() < 0.05 * exact[j]  # step 0 is exact (se 0); later steps measured to 5%
    greedy = torch.tensor(got[False]).mean(0)
    assert greedy[0] == pytest.approx(exact[0], rel=1e-5)  # step 0 needs no weight
    assert all(greedy[j].item() < exact[j] - 10 * se[j].item() for j in (1, 2))


@pytest.mark.parametrize("loss", ["kl", "lk"])
@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("kind", ["eagle3", "peagle", "dflash", "dflash-random"])
def test_the_teacher_at_its_read_rows_trains_and_counts_as_everywhere(kind, right, loss):
    """TTTModule computes the teacher only at the rows its kind's training reads (DraftKind.rows:
    teacher_rows, a counted token among the next ttt_steps positions, packed prompts skipped, their rows left
    zero; for
    DFlash's drawn blocks z_{i+1} .. z_{i+d} alone, fewer still); every loss, gradient (finite: LK's alpha
    is 0 on a zero row) and count equals the teacher computed at every position, for each kind's unroll (its
    training options included), in a packed batch whose prompts are unmasked. `right`: every draft guesses the
    target's argmax (a zero lm_head's first draft id, target id 1, is the target's argmax and the text
    everywhere; a skipped row's argmax is 0), so chains that start in a prompt reach the answer and are
    counted: a window of ttt_steps - 1 fails here for EAGLE-3, whose chains read the teacher that far back,
    one of 1 for P-EAGLE too (DFlash's blocks read z_{q-1} alone). The rows: exactly the `steps` positions
    before each counted token."""
    from test_dflash import dflash
    from test_peagle import peagle

    from eyas.train import ttt
    from eyas.train.kinds import KINDS

    mask = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 0, 0, 1]])
    want = torch.tensor([[0, 1, 1, 1, 0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(ttt.teacher_rows(mask, 2), want)
    options = {
        "peagle": {"cod": (0.7, 0.2), "cod_seed": (0, 0)},
        "dflash": {"anchors": 6, "anchor_seed": (0, 0), "dpace": 0.5},  # the recipes' D-PACE
        "dflash-random": {"anchors": 6, "anchor_seed": (0, 0), "dpace": 0.5, "truncate": True},
    }.get(kind, {})
    kind = kind.split("-")[0]  # dflash-random: DFlash with train.block_lengths random (each block's drafts)
    d = {"eagle3": lambda: make_draft(5), "peagle": lambda: peagle(5), "dflash": lambda: dflash(5)}[kind]()
    d = mapped(d)  # draft id i = target id 2i + 1
    steps = 4
    g = torch.Generator().manual_seed(6)
    B, T, H = 2, 40, 32
    aux, ids = torch.randn(B, T, 3 * H, generator=g), torch.randint(0, 97, (B, T), generator=g)
    doc = packed_docs(B, T, g)
    mask = torch.ones(B, T)
    mask[:, :7], mask[0, 15:22], mask[1, 24:30] = 0, 0, 0  # each row's prompts
    final, W = torch.randn(B, T, H, generator=g), torch.randn(97, H, generator=g)
    if right:
        final[..., 0], W[:, 0], W[1, 0] = 50.0, 0.0, 1.0  # the target's argmax: id 1 everywhere
        ids.fill_(1)  # and the text (a chain goes on where the token fed is the argmax)
        with torch.no_grad():
            d.lm_head.weight.zero_()  # the draft's: its id 0, target id 1, everywhere
    runs = []
    everywhere = lambda ids, m, doc, s, **o: torch.ones_like(m, dtype=torch.bool)  # noqa: E731
    read = KINDS[kind].rows(ids, mask, doc, steps, **options)
    assert (
        read.sum() < ttt.teacher_rows(mask, steps).sum()
        if kind == "dflash"
        else torch.equal(read, ttt.teacher_rows(mask, steps))
    )
    for rows in (KINDS[kind].rows, everywhere):
        unroll, opts = KINDS[kind].forward, options
        module = ttt.TTTModule(
            d, W, steps, 0.8, "dense", False, unroll=unroll, options=opts, rows=rows, loss=loss
        )
        module.train()
        d.zero_grad()
        out = module(aux, ids, mask, doc, final=final)
        out.loss.backward()
        grads = [p.grad.clone() for p in d.parameters() if p.grad is not None]
        assert all(bool(x.isfinite().all()) for x in grads)
        runs.append((out, grads))
    (a, ga), (b, gb) = runs
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-6, atol=0)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)
    for field in ("step_count", "step_right", "step_cond_base", "step_cond_right"):
        assert getattr(a, field) == getattr(b, field), field
    assert a.step_sampled_right == pytest.approx(b.step_sampled_right, rel=1e-6)
    assert not right or a.step_cond_base[-1] > 0
    assert a.step_sampled_right == pytest.approx(b.step_sampled_right, rel=1e-6)
