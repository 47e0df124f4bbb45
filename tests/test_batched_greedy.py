"""Batched speculative decoding is lossless: with 8 requests in flight (ragged prompts, some longer
than the sliding window, more requests joining as others finish), every request's greedy output
equals its own plain Hugging Face greedy output, for chains k = 1..6 and trees, on three random
tiny gpt-oss targets; with the real (random) draft and with oracle drafts that exercise every
acceptance length and tree branch."""

import random

import pytest
import torch
from data_fixtures import one_thread  # noqa: F401  (tiny models: one thread is faster)
from oracle import OracleEngine
from tiny_targets import draft_for, tiny_gpt_oss

from eyas.recipes.types import TreeShape
from eyas.serve.decoding.cache import RowKVCache
from eyas.serve.decoding.engine import Engine, Request
from eyas.serve.decoding.reference import greedy_generate
from eyas.serve.decoding.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = [  # (seed, target size kwargs)
    (0, dict(layers=4, hidden=64, window=8)),
    (1, dict(layers=3, hidden=32, window=5, heads=2, kv=1)),
    (2, dict(layers=6, hidden=48, window=16, heads=4, kv=4, head_dim=12)),
]
SHAPES = [TreeShape.chain(k) for k in range(1, 7)] + [
    TreeShape(2, 2, 4),
    TreeShape(3, 3, 8),
    TreeShape(4, 2, 9),
]
NEW = 24


def prompts_for(target, seed, n=12):
    rng = random.Random(seed)
    w = target.config.sliding_window
    lengths = [rng.randrange(2, 3 * w) for _ in range(n - 2)] + [2 * w + 3, 1]  # ragged, some > window
    return [[rng.randrange(2, 128) for _ in range(L)] for L in lengths]


def run_batched(engine, prompts, params):
    """8 in flight from the start; the other requests are added after two steps and join as rows free up."""
    reqs = [Request(p, params, id=f"r{i}") for i, p in enumerate(prompts)]
    for r in reqs[:8]:
        engine.add(r)
    for _ in range(2):
        engine.step()
    assert len(engine.rows) == 8 and not engine.waiting
    for r in reqs[8:]:
        engine.add(r)
    while engine.busy:
        engine.step()
        assert len(engine.rows) <= engine.max_batch
    return reqs


@pytest.mark.parametrize("seed,size", CASES)
def test_batched_speculative_equals_plain_greedy(seed, size):
    target = tiny_gpt_oss(seed=seed, **size)
    draft = draft_for(target, seed)
    prompts = prompts_for(target, seed)
    refs = [greedy_generate(target, p, max_new_tokens=NEW)[0] for p in prompts]
    assert all(len(r) == NEW for r in refs)
    truth = {f"r{i}": p + ref for i, (p, ref) in enumerate(zip(prompts, refs))}
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW)
    plain = run_batched(Engine(target, max_batch=8), prompts, greedy)
    assert [r.tokens for r in plain] == refs, "plain batched decoding diverged"
    for shape in SHAPES:
        seen = set()
        for p_wrong in (None, 0.0, 0.4):
            if p_wrong is None:  # the real random draft
                eng = Engine(target, draft, shape, max_batch=8)
            else:
                eng = OracleEngine(target, draft, shape, max_batch=8, truth=truth, p_wrong=p_wrong, seed=seed)
            reqs = run_batched(eng, prompts, greedy)
            for r, ref in zip(reqs, refs):
                assert r.tokens == ref, f"{shape.label} p_wrong={p_wrong} {r.id}: diverged from plain greedy"
                assert sum(r.emitted) == len(r.tokens) - 1  # the first token comes from the prefill
                assert all(0 <= a <= shape.steps and 1 <= e <= a + 1 for a, e in zip(r.accepted, r.emitted))
            seen |= {a for r in reqs for a in r.accepted}
            if p_wrong == 0.0 and shape.is_chain:  # a perfect chain: everything accepted until the cut
                assert all(a == shape.steps for r in reqs for a in r.accepted[:-1])
        # every acceptance length (and so every rollback length) happened
        assert seen >= set(range(0, shape.steps + 1 if shape.is_chain else 2)), (shape.label, seen)


def test_eos_and_max_tokens_cut_what_is_emitted():
    target = tiny_gpt_oss(seed=4)
    draft = draft_for(target, 4)
    prompt = list(range(2, 30))
    ref, _, _ = greedy_generate(target, prompt, max_new_tokens=30)
    eos = ref[7]  # pretend the 8th greedy token is eos
    ref_eos, _, _ = greedy_generate(target, prompt, max_new_tokens=30, eos_ids={eos})
    assert ref_eos == ref[: ref.index(eos) + 1]
    truth = {"a": prompt + ref, "b": prompt + ref}
    eng = OracleEngine(target, draft, TreeShape.chain(4), eos_ids={eos}, truth=truth, p_wrong=0.0)
    a = Request(prompt, SamplingParams(temperature=0, max_tokens=30), id="a")
    b = Request(prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), id="b")
    eng.run([a, b])
    assert a.tokens == ref_eos and a.finish_reason == "stop"
    assert b.tokens == ref[:5] and b.finish_reason == "length"
    # tau counts emitted tokens only: the last verification of each was cut
    assert sum(a.emitted) == len(ref_eos) - 1 and sum(b.emitted) == 4
    assert b.accepted == [4] and b.emitted == [4]  # 4 drafts accepted, bonus cut by max_tokens


def test_stop_token_ids_and_abort():
    target = tiny_gpt_oss(seed=5)
    prompt = list(range(3, 20))
    ref, _, _ = greedy_generate(target, prompt, max_new_tokens=12)
    eng = Engine(target)
    r = eng.add(Request(prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[ref[3]])))
    gone = eng.add(Request(prompt, SamplingParams(temperature=0, max_tokens=12)))
    eng.step()
    eng.abort(gone)
    while eng.busy:
        eng.step()
    assert r.tokens == ref[: ref.index(ref[3]) + 1] and r.finish_reason == "stop"
    assert gone.finish_reason == "abort" and len(gone.tokens) < 12


def test_rollback_does_not_use_transformers_cache_classes(monkeypatch):
    """The loop's rollback is its own (cache.py): DynamicCache's crop, whose meaning changed between
    transformers releases, is never called."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("DynamicCache used by the speculative loop")

    monkeypatch.setattr(transformers.DynamicCache, "crop", boom)
    monkeypatch.setattr(transformers.DynamicCache, "update", boom)
    target = tiny_gpt_oss(seed=0)
    draft = draft_for(target, 0)
    prompt = list(range(5, 25))
    eng = Engine(target, draft, TreeShape(3, 2, 5))
    r = eng.run([Request(prompt, SamplingParams(temperature=0, max_tokens=10))])[0]
    monkeypatch.undo()
    assert r.tokens == greedy_generate(target, prompt, max_new_tokens=10)[0]


def test_row_cache_keep_and_guard():
    c = RowKVCache(max_rows=3, min_slots=8)
    k = torch.arange(2 * 1 * 4 * 1, dtype=torch.float32).view(2, 1, 4, 1)  # rows 0-1, 4 new entries
    c.plan(0, torch.tensor([[2, 3, 4, 5], [0, 1, 2, 3]]), kv_len=6)
    keys, _ = c.update(k, k, 0)
    assert keys.shape == (2, 1, 6, 1) and keys[0, 0, 2:6, 0].tolist() == [0, 1, 2, 3]
    # row 0 keeps the entries in slots 2, 4, 5 (a tree path) at 2, 3, 4; row 1 keeps slot 0 (padding pairs)
    c.keep(0, torch.tensor([[2, 4, 5], [0, 0, 0]]), torch.tensor([[2, 3, 4], [0, 0, 0]]))
    assert c.keys[0][0, 0, 2:5, 0].tolist() == [0, 2, 3] and c.keys[0][1, 0, 0:4, 0].tolist() == [4, 5, 6, 7]
    c.move_row(1, 0)
    assert c.keys[0][0, 0, 0:4, 0].tolist() == [4, 5, 6, 7]
    c.reserve(40)  # growth keeps the contents
    assert c.keys[0].shape[2] >= 40 and c.keys[0][0, 0, 0:4, 0].tolist() == [4, 5, 6, 7]
    with pytest.raises(RuntimeError, match="past_key_values.update"):
        c.check_routed(num_layers=4)  # one update call, four layers


def test_context_limit_cuts_speculative_and_plain_alike():
    """At max_model_len, prompt + output stops at exactly the limit, with or without a draft, and
    a speculative row is not stopped early for want of room for a whole verification."""
    target = tiny_gpt_oss(seed=6)
    draft = draft_for(target, 6)
    prompt = list(range(3, 13))  # 10 tokens
    ref, _, _ = greedy_generate(target, prompt, max_new_tokens=20)
    for limit in (11, 12, 16, 18):
        outs = []
        for shape in (None, TreeShape.chain(3), TreeShape(3, 2, 6)):
            truth = {"r": prompt + ref}
            eng = (
                Engine(target, max_batch=2, max_model_len=limit)
                if shape is None
                else OracleEngine(
                    target, draft, shape, max_batch=2, max_model_len=limit, truth=truth, p_wrong=0.2
                )
            )
            r = eng.run([Request(prompt, SamplingParams(temperature=0, max_tokens=100), id="r")])[0]
            assert len(prompt) + len(r.tokens) == limit and r.finish_reason == "length", (limit, shape)
            outs.append(r.tokens)
        assert outs[0] == outs[1] == outs[2] == ref[: limit - len(prompt)]


def test_greedy_and_sampled_rows_share_a_batch():
    """Greedy requests decoded next to sampled ones (one target forward, one verification per step)
    still equal plain greedy; seeded sampled requests repeat exactly."""
    target = tiny_gpt_oss(seed=8)
    draft = draft_for(target, 8)
    prompts = prompts_for(target, 8, n=6)
    refs = [greedy_generate(target, p, max_new_tokens=NEW)[0] for p in prompts]
    runs = []
    for _ in range(2):
        eng = Engine(target, draft, TreeShape(3, 2, 5), max_batch=6)
        reqs = [
            Request(p, SamplingParams(temperature=0 if i % 2 == 0 else 1.0, top_k=20, seed=i, max_tokens=NEW))
            for i, p in enumerate(prompts)
        ]
        runs.append(eng.run(reqs))
    for i, (a, b) in enumerate(zip(*runs)):
        assert a.tokens == b.tokens
        if i % 2 == 0:
            assert a.tokens == refs[i]
    assert any(runs[0][i].tokens != refs[i] for i in range(1, 6, 2))  # sampling did sample


def test_plain_decoding_records_no_verifications():
    """Without a draft there is nothing to verify: no acceptance entries (and so no spec-decode
    metrics on a server for `speculative: false` requests or a `--no-speculation` server)."""
    target = tiny_gpt_oss(seed=9)
    r = Engine(target).run([Request(list(range(3, 12)), SamplingParams(temperature=0, max_tokens=6))])[0]
    assert len(r.tokens) == 6 and r.emitted == [] and r.accepted == []
