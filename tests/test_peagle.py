"""P-EAGLE (train/kinds/peagle): training's depth-d logits equal the loop's one drafting forward on the same
context (fp32), with and without COD sampling, for every TTT attention and the draft options; COD keeps
nested anchors at the stated shares."""

import pytest
import torch
from oracle import OracleEngine
from test_batched_greedy import CASES as CASES_GREEDY
from test_batched_greedy import NEW, prompts_for, run_batched
from tiny_targets import draft_for, tiny_gpt_oss

from eyas.data.target import HiddenStateTap
from eyas.recipes.types import TreeShape
from eyas.serve.decoding.engine import Engine, Request
from eyas.serve.decoding.reference import greedy_generate
from eyas.serve.decoding.sampling import SamplingParams
from eyas.train.kinds import make_draft
from eyas.train.kinds.config import DraftConfig
from eyas.train.kinds.peagle.core import cod_anchors, cod_forward
from eyas.train.model import KVCache
from eyas.train.packing import doc_ids_from_lengths

MASK = 5


def peagle(seed, **options):
    torch.manual_seed(seed)
    options = {"aux_layer_ids": [1, 2, 3], **options}
    cfg = DraftConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        vocab_size=97,
        draft_vocab_size=40,
        kind="peagle",
        mask_token_id=MASK,
        **options,
    )
    d = make_draft(cfg).float().eval()
    d.reset_parameters(std=0.2)  # large weights so that depths differ noticeably
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return d


CASES = [
    ("dense", {}, (1.0, 1.0)),
    ("chunked", {}, (1.0, 1.0)),
    ("sdpa", {}, (1.0, 1.0)),
    ("sdpa", {}, (0.6, 0.3)),
    ("chunked", {"num_layers": 2, "norm_before_fc": True, "norm_output": True}, (0.6, 0.3)),
    ("chunked", {"sliding_window": 6}, (1.0, 1.0)),
]


@pytest.mark.parametrize("attention,options,cod", CASES)
def test_depth_logits_equal_the_loops_one_forward(attention, options, cod, monkeypatch):
    """Depth d at anchor i == the loop's round after x_0..x_{i+1}: step 0 over the prefix, then ONE forward of
    the K - 1 mask slots at positions i+1..i+K-1 against that cache (fp32, <= 2e-4). Two packed sequences in
    one row and a row of its own: positions restart, nothing crosses a sequence. With COD only the kept
    anchors have logits, and every kept one matches."""
    monkeypatch.setattr("eyas.train.attention.tile_size", lambda *a: 4)
    d = peagle(1, **options)
    K, T = 5, 14
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 97, (2, T), generator=g)
    aux = torch.randn(2, T, d.config.fc_in_features, generator=g) * 3
    doc = torch.stack([doc_ids_from_lengths(torch.tensor([8, 6]), T)[0], torch.zeros(T, dtype=torch.long)])
    torch.manual_seed(0)
    with torch.no_grad():
        out = cod_forward(d, aux, ids, torch.ones(2, T), doc, None, K, attention=attention, cod=cod)
        fused = d.fuse(aux)
    checked = 0
    for b in range(2):
        starts = [0, 8, T] if b == 0 else [0, T]
        for lo, hi in zip(starts, starts[1:]):
            for i in range(lo, hi - 1):
                cache = KVCache()
                pos = torch.arange(i - lo + 1)[None]
                with torch.no_grad():
                    prefix = ids[b : b + 1, lo + 1 : i + 2], fused[b : b + 1, lo : i + 1]
                    _, first = d.step(*prefix, pos, cache)
                    mids, mh = d.mask_inputs((1, K - 1))
                    _, rest = d.step(mids, mh, pos[:, -1:] + torch.arange(1, K)[None], cache)
                loop = torch.cat([first[0, -1:], rest[0]])  # (K, V_d): depth 0..K-1
                for depth in range(K):
                    if i + 2 + depth >= hi:
                        break  # predicts past its sequence: not trained, not counted
                    got = out.logits[depth][b, i]
                    if depth and not got.abs().any():
                        continue  # COD dropped this anchor at this depth
                    torch.testing.assert_close(got, loop[depth], atol=2e-4, rtol=0)
                    checked += depth > 0
    assert checked >= (30 if cod == (1.0, 1.0) else 8), checked


def test_depths_differ_and_mask_hidden_matters():
    """Against a vacuous pass: the depths' logits differ, and so does a depth when mask_hidden changes."""
    d = peagle(3)
    ids, aux = torch.randint(0, 97, (1, 9)), torch.randn(1, 9, 96)
    args = (ids, torch.ones(1, 9), torch.zeros(1, 9, dtype=torch.long), None, 3)
    with torch.no_grad():
        a = cod_forward(d, aux, *args)
        d.mask_hidden.weight.add_(1.0)
        b = cod_forward(d, aux, *args)
    assert (a.logits[1] - a.logits[2])[:, :5].abs().max() > 1e-2
    assert (a.logits[1] - b.logits[1])[:, :5].abs().max() > 1e-2
    torch.testing.assert_close(a.logits[0], b.logits[0])  # depth 0 never sees a mask slot


def test_cod_keeps_nested_shares():
    """ratio 0.5, floor 0.2 over 4 rows of 250 counted positions: depth d keeps int(250 * max(0.5**d, 0.2))
    = 125, 62, 50, 50 anchors a row, each within the last depth's and within its own counted positions; the
    same seeds draw the same anchors, other seeds others."""
    valid = [torch.ones(4, 250, dtype=torch.bool) for _ in range(5)]
    for d in range(1, 5):
        valid[d][:, 250 - 2 - d :] = False  # past the end: not counted
    kept = cod_anchors(valid, 0.5, 0.2, [1, 2, 3, 4])
    assert [int(k.sum()) for k in kept] == [500, 248, 200, 200]  # int(250 * 0.25) = 62 per row
    prev = valid[0]
    for d, k in enumerate(kept, 1):
        assert not (k & ~prev).any() and not (k & ~valid[d]).any()
        prev = k
    again, other = cod_anchors(valid, 0.5, 0.2, [1, 2, 3, 4]), cod_anchors(valid, 0.5, 0.2, [5, 6, 7, 8])
    assert all(torch.equal(a, b) for a, b in zip(kept, again))
    assert not torch.equal(kept[0], other[0])


@pytest.mark.parametrize("seed,size", CASES_GREEDY[:2])
def test_batched_parallel_drafts_are_lossless(seed, size):
    """8 requests in flight, ragged, joining as others finish: P-EAGLE chains K = 1..5 (one draft forward a
    round) emit exactly each request's plain greedy output, with the real (random) draft and with oracle
    drafts that exercise every acceptance length."""
    target = tiny_gpt_oss(seed=seed, **size)
    draft = draft_for(target, seed, kind="peagle")
    prompts = prompts_for(target, seed)
    refs = [greedy_generate(target, p, max_new_tokens=NEW)[0] for p in prompts]
    truth = {f"r{i}": p + ref for i, (p, ref) in enumerate(zip(prompts, refs))}
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW)
    for k in range(1, 6):
        seen = set()
        for p_wrong in (None, 0.0, 0.4):
            shape = TreeShape.chain(k)
            if p_wrong is None:
                eng = Engine(target, draft, shape, max_batch=8)
            else:
                eng = OracleEngine(target, draft, shape, max_batch=8, truth=truth, p_wrong=p_wrong, seed=seed)
            reqs = run_batched(eng, prompts, greedy)
            assert [r.tokens for r in reqs] == refs, f"K={k} p_wrong={p_wrong}: diverged from plain greedy"
            seen |= {a for r in reqs for a in r.accepted}
        assert seen >= set(range(k + 1)), (k, seen)


def test_engine_proposes_what_training_scores():
    """Every round of the loop (3 ragged requests in flight, rows at different lengths, K = 4) proposes for
    each row, at each depth, the argmax of training's depth-d logits (cod_forward, every anchor) at that
    row's anchor, computed from the target's states over the request's final text: the loop's drafting
    forward, batched, is the one training trains."""
    target = tiny_gpt_oss(seed=5)
    draft = draft_for(target, 5, kind="peagle")
    with torch.no_grad():
        draft.mask_hidden.weight.normal_(0, 3.0)
    K, g = 4, torch.Generator().manual_seed(5)
    prompts = [[int(t) for t in torch.randint(2, 128, (n,), generator=g)] for n in (11, 3, 19)]
    eng = Engine(target, draft, TreeShape.chain(K), max_batch=3)
    rounds = []
    propose = eng._propose

    def record(n, n_max, B):
        tree = propose(n, n_max, B)
        rounds.extend((eng.rows[b].id, int(n[b]), tree.tokens[b, 1:].tolist()) for b in range(B))
        return tree

    eng._propose = record
    params = SamplingParams(temperature=0.0, max_tokens=20)
    reqs = eng.run([Request(p, params, id=str(i)) for i, p in enumerate(prompts)])
    logits = {}
    for req, prompt in zip(reqs, prompts):
        seq = torch.tensor([prompt + req.tokens])
        tap = HiddenStateTap(target, draft.config.aux_layer_ids)
        with torch.no_grad():
            target(seq)
            L = seq.shape[1]
            out = cod_forward(
                draft, tap.aux, seq, torch.ones(1, L), torch.zeros(1, L, dtype=torch.long), None, K
            )
        tap.remove()
        logits[req.id] = (L, out.logits)
    compared = 0
    for rid, n, proposed in rounds:
        L, depth_logits = logits[rid]
        depths = [d for d in range(K) if n + 1 + d < L]  # training scores x_{n+1+d} only inside the text
        want = [int(draft.to_target_ids(depth_logits[d][0, n - 1].argmax())) for d in depths]
        assert proposed[: len(depths)] == want, f"request {rid} at n={n}: loop {proposed} != training {want}"
        compared += len(depths)
    assert compared >= 60 and len({rid for rid, _, _ in rounds}) == 3


def test_validation_counts_are_ttts_and_cod_keeps_its_shares():
    """In eval mode (cod (1, 1)) a loss mask with gaps counts exactly what TTT counts at every depth (a
    depth's slots exist at every anchor, so a gap drops nothing). With COD (0.5 / 0.2) and a full loss mask,
    depth d counts int(n_b * max(0.5**d, 0.2)) anchors per row, n_b = T - 2 counted depth-0 positions."""
    from eyas.train.ttt import target_view, ttt_forward

    d = peagle(2)
    B, T, K = 2, 24, 5
    g = torch.Generator().manual_seed(3)
    ids, aux = torch.randint(0, 97, (B, T), generator=g), torch.randn(B, T, 96, generator=g)
    mask = torch.ones(B, T)
    mask[:, :4], mask[0, 9:12], mask[1, 15] = 0, 0, 0  # a prompt, then gaps in the answers
    doc = torch.zeros(B, T, dtype=torch.long)
    lm_head = torch.randn(97, 32, generator=g)
    with torch.no_grad():
        view = target_view(torch.randn(B, T, 32, generator=g), lm_head, d)
        exact = cod_forward(d, aux, ids, mask, doc, view, K)
        ttt = ttt_forward(d, aux, ids, mask, doc, view, K)
        assert exact.step_count == ttt.step_count and min(exact.step_count) > 0
        cod = cod_forward(d, aux, ids, torch.ones(B, T), doc, view, K, cod=(0.5, 0.2), cod_seed=(0, 0))
    assert cod.step_count == [B * int((T - 2) * max(0.5**k, 0.2)) for k in range(K)]


def test_muon_leaves_mask_hidden_to_adamw():
    """mask_hidden (1, n_aux * H) is 2-D but a learned input vector: Muon would orthogonalise one row (only
    fix its norm), so AdamW takes it, as it takes the embedding and lm_head."""
    from eyas.train.optim import muon_params

    d = peagle(0)
    chosen = {id(p) for p in muon_params(list(d.named_parameters()))}
    assert id(d.mask_hidden.weight) not in chosen and id(d.fc.weight) in chosen


def test_k_advice_prices_one_draft_forward_for_parallel_drafts():
    """eval/advice.py: a round of a P-EAGLE chain costs the step 0 and one mask forward (2 forwards at any
    K > 1), an EAGLE-3 chain K forwards. With a cost model of 1 ms a draft forward and the same tau, K = 5:
    EAGLE-3 pays 5 ms of draft, P-EAGLE 2 ms; the fit reads each run's forwards by its kind."""
    from eyas.eval import advice
    from eyas.serve.decoding.engine import StepStats

    model = {
        "target": {"intercept_s": 0.010, "per_verified_token_s": 0.0, "per_context_token_s": 0.0},
        "draft": {"per_forward_s": 0.001, "per_draft_token_s": 0.0},
        "plain_overhead_s": 0.0,
    }
    shape = TreeShape.chain(5)
    assert advice.predict(model, shape, 3.0, 1, 0, "eagle3") == pytest.approx(3.0 / 0.015)
    assert advice.predict(model, shape, 3.0, 1, 0, "peagle") == pytest.approx(3.0 / 0.012)
    steps = [StepStats("decode", 1, 6, 10, 0.010, 0.010 + f * 0.001, 3) for f in (2, 2, 2)]
    fit = advice.fit_cost_model([{"shape": shape, "kind": "peagle", "steps": steps}])
    assert fit["draft"]["per_forward_s"] + fit["draft"]["per_draft_token_s"] * 7 / 2 == pytest.approx(0.001)


def test_the_recipe_offers_exactly_the_registered_kinds():
    """recipes/draft.py's sections, one a kind, are train/kinds/'s registry, each the section of its own name
    only (the schema stays torch-free)."""
    import typing

    from eyas.recipes.draft import SECTIONS
    from eyas.train.kinds import KINDS

    assert list(SECTIONS) == list(KINDS)
    assert all(typing.get_args(c.model_fields["kind"].annotation) == (n,) for n, c in SECTIONS.items())
