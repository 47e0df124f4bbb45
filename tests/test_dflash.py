"""DFlash (train/kinds/dflash): training's block logits equal the loop's one block forward on the same context
(fp32), packed or not; the loop's batched blocks are lossless and propose what training scores; validation
counts what TTT counts; the anchors are drawn as stated."""

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
from eyas.train.kinds.dflash.core import dflash_forward
from eyas.train.model import KVCache
from eyas.train.packing import doc_ids_from_lengths

MASK = 5


def dflash(seed, **options):
    torch.manual_seed(seed)
    sizes = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48}
    options = {"aux_layer_ids": [1, 2, 3], "num_layers": 2, "block_size": 5, **sizes, **options}
    cfg = DraftConfig(
        hidden_size=32, vocab_size=97, draft_vocab_size=40, kind="dflash", mask_token_id=MASK, **options
    )
    d = make_draft(cfg).float().eval()
    t2d = torch.zeros(97, dtype=torch.bool)
    t2d[:40] = True
    d.set_vocab_map(torch.zeros(40, dtype=torch.long), t2d)  # draft id i = target id i
    d.reset_parameters(std=0.2)  # large weights so that slots differ noticeably
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.1)
    return d


def loop_block(d, aux, ids, lo, n, S):
    """The loop's round after x_lo..x_{n-1} committed and x_n pending: context keys of lo..n-1, then one
    block [x_n, mask...] at positions n-lo .. (positions restart at lo) -> logits (S, V_d)."""
    cache = KVCache()
    pos = torch.arange(n - lo)[None]
    d.write_context(d.fuse(aux[None, lo:n]), pos, cache)
    block = d.block_inputs(ids[n : n + 1], S)
    slots = (n - lo) + torch.arange(S)[None]
    return d.block(block, slots, cache, torch.ones(1, S, n - lo + S, dtype=torch.bool))[0]


@pytest.mark.parametrize("options", [{}, {"attention_bias": True, "num_layers": 1}])
def test_block_logits_equal_the_loops_one_forward(options, monkeypatch):
    """Slot s of the block anchored at i + 1 (training's draft s - 1 at index i) == the loop's block after
    x_0..x_i with x_{i+1} pending, for every anchor of two packed sequences in one row and a row of its own
    (fp32, <= 2e-5): positions restart, nothing crosses a sequence. Anchor chunks of 3 blocks (ANCHOR_KEYS)
    give the same logits as one chunk."""
    d = dflash(1, **options)
    S, T = d.config.block_size, 14
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 97, (2, T), generator=g)
    aux = torch.randn(2, T, d.config.fc_in_features, generator=g) * 3
    doc = torch.stack([doc_ids_from_lengths(torch.tensor([8, 6]), T)[0], torch.zeros(T, dtype=torch.long)])
    with torch.no_grad():
        out = dflash_forward(d, aux, ids, torch.ones(2, T), doc, None, S - 1)
        monkeypatch.setattr("eyas.train.kinds.dflash.core.ANCHOR_KEYS", 3 * S * (T + 3 * S))
        chunked = dflash_forward(d, aux, ids, torch.ones(2, T), doc, None, S - 1)
    checked = 0
    for b in range(2):
        starts = [0, 8, T] if b == 0 else [0, T]
        for lo, hi in zip(starts, starts[1:]):
            for i in range(lo, hi - 2):  # a block with a draft inside its sequence (x_{i+2} is there)
                want = loop_block(d, aux[b], ids[b], lo, i + 1, S)
                for s in range(1, S):
                    got = out.logits[s - 1][b, i]
                    assert torch.allclose(got, want[s], atol=2e-5), (b, i, s, (got - want[s]).abs().max())
                    assert torch.allclose(chunked.logits[s - 1][b, i], got, atol=2e-5)
                    checked += 1
    assert checked == (6 + 4 + 12) * (S - 1)
    drafts = torch.stack([lg.argmax(-1) for lg in out.logits])  # (S - 1, B, T)
    computed = out.logits[0].abs().sum(-1) > 0  # (B, T) the blocks run (zeros elsewhere)
    assert (drafts[0] != drafts[1])[computed].float().mean() > 0.3  # the slots draft different tokens


def test_random_block_lengths_train_the_shorter_blocks_the_loop_runs():
    """train.block_lengths random (dflash_forward truncate): each block keeps its first 1 .. S - 1 drafts,
    drawn per block, and its kept slots' logits equal the loop's block of that many drafts (k + 1 slots: the
    block vLLM runs at num_speculative_tokens k), fp32 within 2e-5; the dropped slots score nothing (zero
    logits on the grid). Every length is drawn over the row's blocks."""
    d = dflash(3, num_layers=1)
    S, T = d.config.block_size, 16
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 97, (1, T), generator=g)
    aux = torch.randn(1, T, d.config.fc_in_features, generator=g) * 3
    doc = torch.zeros(1, T, dtype=torch.long)
    torch.manual_seed(0)  # the lengths' draw (unseeded anchors: the global generator)
    with torch.no_grad():
        out = dflash_forward(d, aux, ids, torch.ones(1, T), doc, None, S - 1, truncate=True)
    lengths = set()
    for i in range(T - 2):
        kept = [s for s in range(1, S) if out.logits[s - 1][0, i].abs().sum() > 0]
        n = len(kept)
        assert kept == list(range(1, n + 1)) and n >= 1, (i, kept)  # a block's first n drafts
        want = loop_block(d, aux[0], ids[0], 0, i + 1, n + 1)
        for s in kept:
            got = out.logits[s - 1][0, i]
            assert torch.allclose(got, want[s], atol=2e-5), (i, n, s, (got - want[s]).abs().max())
        lengths.add(n)
    assert lengths == set(range(1, S)), lengths


def test_the_mask_slots_see_each_other_and_the_context_before_the_anchor_only():
    """Non-causal block: changing the block's last slot token changes slot 1's logits. Training's block at
    anchor 6 reads no target state of position 6 (not yet verified when it drafts), the block at anchor 7
    does."""
    d = dflash(2, num_layers=1)
    S, T = d.config.block_size, 10
    g = torch.Generator().manual_seed(1)
    ids, aux = torch.randint(0, 97, (T,), generator=g), torch.randn(T, 96, generator=g)
    base = loop_block(d, aux, ids, 0, 6, S)
    cache = KVCache()
    d.write_context(d.fuse(aux[None, :6]), torch.arange(6)[None], cache)
    block = d.block_inputs(ids[6:7], S)
    block[0, -1] = 11
    other = d.block(block, 6 + torch.arange(S)[None], cache, torch.ones(1, S, 6 + S, dtype=torch.bool))[0]
    assert (other[1] - base[1]).abs().max() > 1e-3
    with torch.no_grad():  # training's block at index 5 (anchor 6) reads the states of positions < 6 only
        doc, mask = torch.zeros(1, T, dtype=torch.long), torch.ones(1, T)
        out = dflash_forward(d, aux[None], ids[None], mask, doc, None, S - 1).logits
        moved = aux.clone()
        moved[6] += 5.0
        after = dflash_forward(d, moved[None], ids[None], mask, doc, None, S - 1).logits
        assert all(torch.equal(a[0, 5], b[0, 5]) for a, b in zip(out, after))
        assert (after[0][0, 6] - out[0][0, 6]).abs().max() > 1e-3  # anchor 7's context does hold position 6


@pytest.mark.parametrize("seed,size", CASES_GREEDY[:2])
def test_batched_blocks_are_lossless(seed, size):
    """8 requests in flight, ragged, joining as others finish: DFlash blocks of k + 1 (k = 1..5, one block
    forward a round) emit exactly each request's plain greedy output, with the real (random) draft and with
    oracle drafts that exercise every acceptance length."""
    target = tiny_gpt_oss(seed=seed, **size)
    draft = draft_for(target, seed, kind="dflash")
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
            assert [r.tokens for r in reqs] == refs, f"k={k} p_wrong={p_wrong}: diverged from plain greedy"
            seen |= {a for r in reqs for a in r.accepted}
        assert seen >= set(range(k + 1)), (k, seen)


def test_engine_proposes_what_training_scores():
    """Every round of the loop (3 ragged requests in flight, k = 5: the whole block) proposes for each row
    the argmax of training's block logits (dflash_forward, every anchor) at that row's anchor, computed from
    the target's states over the request's final text: the loop's batched block is the one training trains."""
    target = tiny_gpt_oss(seed=5)
    draft = draft_for(target, 5, kind="dflash")
    k, g = draft.config.block_size - 1, torch.Generator().manual_seed(5)
    prompts = [[int(t) for t in torch.randint(2, 128, (n,), generator=g)] for n in (11, 3, 19)]
    eng = Engine(target, draft, TreeShape.chain(k), max_batch=3)
    rounds = []
    propose = eng._propose

    def record(n, n_max, B):
        tree = propose(n, n_max, B)
        rounds.extend((eng.rows[b].id, int(n[b]), tree.tokens[b, 1:].tolist()) for b in range(B))
        return tree

    eng._propose = record
    reqs = eng.run(
        [Request(p, SamplingParams(temperature=0.0, max_tokens=20), id=str(i)) for i, p in enumerate(prompts)]
    )
    logits = {}
    for req, prompt in zip(reqs, prompts):
        seq = torch.tensor([prompt + req.tokens])
        tap = HiddenStateTap(target, draft.config.aux_layer_ids)
        with torch.no_grad():
            target(seq)
            L = seq.shape[1]
            out = dflash_forward(
                draft, tap.aux, seq, torch.ones(1, L), torch.zeros(1, L, dtype=torch.long), None, k
            )
        tap.remove()
        logits[req.id] = (L, out.logits)
    compared = 0
    for rid, n, proposed in rounds:
        L, slot_logits = logits[rid]
        if n >= L:
            continue
        want = [int(draft.to_target_ids(slot_logits[s][0, n - 1].argmax())) for s in range(k)]
        assert proposed == want, f"request {rid} at n={n}: loop {proposed} != training {want}"
        compared += k
    assert compared >= 60 and len({rid for rid, _, _ in rounds}) == 3


def test_validation_counts_are_ttts_and_anchors_are_drawn_per_row():
    """Every anchor (validation): with gaps in the loss mask the counts are exactly TTT's at every draft.
    Training (anchors=4, seeded): each row keeps min(4, its counted first drafts) blocks, the same ones for
    the same tokens and seed, others for another epoch."""
    from eyas.train.ttt import target_view

    d = dflash(2, block_size=6)
    B, T, k = 2, 24, 5
    g = torch.Generator().manual_seed(3)
    ids, aux = torch.randint(0, 97, (B, T), generator=g), torch.randn(B, T, 96, generator=g)
    mask = torch.ones(B, T)
    mask[:, :4], mask[0, 9:12], mask[1, 15] = 0, 0, 0
    doc = torch.zeros(B, T, dtype=torch.long)
    lm_head = torch.randn(97, 32, generator=g)
    with torch.no_grad():
        view = target_view(torch.randn(B, T, 32, generator=g), lm_head, d)
        every = dflash_forward(d, aux, ids, mask, doc, view, k)
    # TTT counts draft j at index i where x_{i+2+j} is loss-masked (one sequence a row)
    assert every.step_count == [int(mask[:, 2 + j :].sum()) for j in range(k)]
    with torch.no_grad():
        a = dflash_forward(d, aux, ids, mask, doc, view, k, anchors=4, anchor_seed=(0, 0))
        b = dflash_forward(d, aux, ids, mask, doc, view, k, anchors=4, anchor_seed=(0, 0))
        c = dflash_forward(d, aux, ids, mask, doc, view, k, anchors=4, anchor_seed=(0, 1))
    assert (
        a.step_count[0] == B * 4 and a.step_count == b.step_count and torch.equal(a.run_length, b.run_length)
    )
    assert not torch.equal(a.run_length, c.run_length) or a.step_count != c.step_count


def test_dpace_weights_are_the_expected_run_each_draft_starts():
    """D-PACE (train/kinds/dflash dpace_weights) on every anchor of a row with a loss-mask gap: with alpha = 1
    (every confidence 1) draft d weighs the trained drafts from d to the block's end; with alpha = 0.4 it is
    sum_{m >= d} prod_{l <= m} (0.6 q_l + 0.4) over the trained ones, q_l the draft's probability of the
    target's argmax, recomputed here from training's logits. A training step with it runs and is finite."""
    from eyas.train.kinds.dflash.core import dpace_weights
    from eyas.train.ttt import target_view

    d = dflash(4, block_size=5)
    B, T, S = 1, 16, 5
    g = torch.Generator().manual_seed(4)
    ids, aux = torch.randint(0, 97, (B, T), generator=g), torch.randn(B, T, 96, generator=g)
    mask = torch.ones(B, T)
    mask[0, 7] = 0
    doc = torch.zeros(B, T, dtype=torch.long)
    view = target_view(torch.randn(B, T, 32, generator=g), torch.randn(97, 32, generator=g), d)
    kept = torch.ones(B, T, dtype=torch.bool)
    kept[0, -1] = False
    with torch.no_grad():
        from eyas.train.kinds.dflash.core import block_outputs
        from eyas.train.packing import positions_in_doc

        prenorm = block_outputs(d, aux, ids, doc, positions_in_doc(doc), kept, S, False)
        logits = [d.logits(prenorm[:, s + 1]).log_softmax(-1) for s in range(S - 1)]
    to_draft = {int(t): i for i, t in enumerate(d.to_target_ids(torch.arange(40)))}
    checked = 0
    for alpha in (1.0, 0.4):
        w = dpace_weights(d, prenorm, kept, view, mask, doc, alpha)
        for i in range(T - 1):
            trained = [
                i + 2 + j < T and mask[0, i + 2 + j] > 0 and bool(view.in_draft[0, i + 1 + j])
                for j in range(S - 1)
            ]
            c, run, want = [], 1.0, []
            for j in range(S - 1):
                q = logits[j][i, to_draft.get(int(view.argmax[0, min(i + 1 + j, T - 1)]), 0)].exp().item()
                run *= (1 - alpha) * q + alpha if trained[j] else 1.0
                c.append(run if trained[j] else 0.0)
            want = [sum(c[j:]) if trained[j] else 0.0 for j in range(S - 1)]
            got = [float(w[j][0, i]) for j in range(S - 1)]
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6), (alpha, i, got, want)
            checked += sum(trained)
    assert checked >= 20  # trained drafts (the target's argmax in the draft vocab), both alphas
    out = dflash_forward(
        d.train(), aux, ids, mask, doc, view, S - 1, anchors=6, anchor_seed=(0, 0), dpace=0.5
    )
    out.loss.backward()
    assert torch.isfinite(out.loss) and d.fc.weight.grad.abs().sum() > 0


def test_the_recipe_ties_the_block_to_the_drafts():
    """draft.block_size sets train.ttt_steps (block_size - 1), and the other way round (neither: speculators'
    16, and 5 layers); disagreeing values, a block on another kind, trees and EAGLE-3's layer options are
    refused by name. Sequence parallelism is taken (train/sequence_parallel.py: the context gathered)."""
    from eyas.recipes.load import RecipeError, load_recipe
    from eyas.recipes.schema import Recipe

    r = Recipe.model_validate({"draft": {"kind": "dflash", "block_size": 8}, "eval": {"k": 7}})
    assert r.train.ttt_steps == 7 and r.draft.block_size == 8
    r = Recipe.model_validate({"draft": {"kind": "dflash"}, "train": {"ttt_steps": 5}, "eval": {"k": 5}})
    assert r.draft.block_size == 6 and r.draft.num_layers == 5
    r = Recipe.model_validate({"draft": {"kind": "dflash", "num_layers": 2}})  # speculators' block
    assert (r.draft.block_size, r.train.ttt_steps, r.draft.num_layers) == (16, 15, 2)
    r = Recipe.model_validate({"draft": {"kind": "dflash"}, "train": {"sequence_parallel": 2}})
    assert r.train.sequence_parallel == 2
    bad = [
        ({"draft": {"kind": "dflash", "block_size": 8}, "train": {"ttt_steps": 5}}, "train.ttt_steps"),
        ({"draft": {"block_size": 8}}, "draft.block_size"),
        ({"draft": {"attention_bias": True}}, "draft.attention_bias"),
        ({"draft": {"kind": "dflash"}, "eval": {"tree": ["3,2,4"]}}, "eval.tree"),
        ({"draft": {"kind": "dflash", "norm_before_fc": True}}, "draft.norm_before_fc"),
    ]
    for raw, key in bad:
        with pytest.raises(RecipeError, match=rf"^{key}: "):
            load_recipe(raw)


def test_zlab_gpt_oss_120b_dflash_is_the_recipes_shape():
    """z-lab/gpt-oss-120b-DFlash's published config (tests/fixtures, not downloaded) reads as a DFlash draft
    of eyas ids [2, 10, 18, 26, 34] (its target_layer_ids number layer outputs), block 10, mask 200000, 8
    biased layers; recipes/gpt-oss-120b-dflash.yaml on eyas's built-in gpt-oss-120b config draws the same
    shape (RoPE aside: z-lab's plain theta 150000, eyas's the target's YaRN), and `eyas plan` counts its
    784,767,104 trainable parameters (z-lab's "0.8B"). Exported back, the config says what z-lab's says."""
    import json
    from pathlib import Path

    import torch

    from eyas.plan.cost import count_draft, target_config
    from eyas.recipes.load import load_recipe
    from eyas.train.kinds.dflash.layout import dflash_config, read_dflash_config

    raw = json.loads(
        (Path(__file__).parent / "fixtures" / "zlab-gpt-oss-120b-dflash.config.json").read_text()
    )
    theirs = read_dflash_config(raw, "openai/gpt-oss-120b", "fixture")
    assert theirs.aux_layer_ids == [2, 10, 18, 26, 34] and theirs.block_size == 10
    assert (theirs.mask_token_id, theirs.num_layers, theirs.attention_bias) == (200000, 8, True)
    recipe = load_recipe("recipes/gpt-oss-120b-dflash.yaml")
    count = count_draft(recipe, target_config(recipe)[0])
    mine = count.config
    # trained_k: what eyas's training records (whole blocks: [9]); z-lab's config records none
    assert (mine.trained_k, theirs.trained_k) == ([9], None)
    shape = [f for f in vars(theirs) if f not in ("rope_parameters", "target_model", "trained_k")]
    assert {f: getattr(mine, f) for f in shape} == {f: getattr(theirs, f) for f in shape}
    # 8 x (q 2880x4096 + k, v 2880x512 + o 4096x2880, biases; MLP 3 x 2880x7680; 4 norms) + fc 5 x 2880^2
    # + hidden_norm + norm: 8 x 92,911,168 + 41,477,760
    assert count.trainable == 784_767_104
    out = dflash_config(mine, torch.bfloat16)
    for key in ("architectures", "block_size", "dflash_config", "num_hidden_layers", "attention_bias"):
        assert out[key] == raw[key], key


def test_a_trained_dflash_draft_clears_its_floor_and_weakened_ones_do_not(dflash_llama):
    """The DFlash draft conftest's dflash_llama trains on the learnable Llama, in eyas's loop (greedy, k = 3,
    12 prompts, 48 new tokens, lossless): tau >= 2.1. Weakened, it falls below: the same draft with its
    context cut (fc zeroed: the blocks see no target state, only the anchor token), or every weight re-drawn
    at random. Measured on the 2-core EPYC with AVX512-BF16: trained 2.337, context cut 1.908, re-drawn 1.016;
    on the one with AVX2 only: 2.337, 1.899, 1.016."""
    import copy

    from eyas.data.chat import eos_token_ids
    from eyas.data.target import load_target
    from eyas.infra.layout import resolve_checkpoint
    from eyas.train.checkpoint import load_draft

    target, run, prompts = dflash_llama
    model, tok = load_target(str(target), dtype="float32", device="cpu")
    draft = load_draft(resolve_checkpoint(run), device="cpu", dtype=torch.float32).eval()
    cut = copy.deepcopy(draft)
    with torch.no_grad():
        cut.fc.weight.zero_()
    redrawn = copy.deepcopy(draft)
    torch.manual_seed(0)
    redrawn.reset_parameters()
    refs = [
        greedy_generate(model, p, max_new_tokens=48, eos_ids=eos_token_ids(model, tok))[0] for p in prompts
    ]
    taus = {}
    for name, d in (("trained", draft), ("context cut", cut), ("re-drawn", redrawn)):
        eng = Engine(model, d, TreeShape.chain(3), max_batch=len(prompts), eos_ids=eos_token_ids(model, tok))
        reqs = eng.run([Request(p, SamplingParams(temperature=0.0, max_tokens=48)) for p in prompts])
        assert [r.tokens for r in reqs] == refs, f"{name}: not lossless"
        verifications = sum(len(r.accepted) for r in reqs)
        taus[name] = 1 + sum(sum(r.accepted) for r in reqs) / verifications
    print(taus)
    assert taus["trained"] >= 2.1 > max(taus["context cut"], taus["re-drawn"]), taus


def test_a_dflash_draft_serves_only_the_block_it_trained(tmp_path):
    """A DFlash draft that records its training (trained_k [5]: whole blocks of 6) runs in the loop at k = 5
    only: k = 3 (a shorter block, whose slots would see fewer mask slots than in training) is refused in one
    line that says what to serve, and so is a P-EAGLE draft of 3 trained depths at k = 4 (k <= 3 runs).
    Without a record (a draft imported from another trainer's layout) the loop runs the shorter block, as
    vLLM does. `eyas eval` and `eyas serve` refuse it before loading the target, naming the draft. A recipe's
    DFlash eval.k follows its block (16: 15), a more_k of another length is refused by name, and with
    train.block_lengths random every k up to the block's is trained (an option of DFlash's alone)."""
    from tiny_targets import draft_for, tiny_gpt_oss

    from eyas.eval.evaluate import resolve_settings
    from eyas.infra.errors import InputError
    from eyas.recipes.load import RecipeError
    from eyas.recipes.schema import Recipe
    from eyas.serve.api.server import build_served
    from eyas.train.checkpoint import save_draft
    from eyas.train.kinds import kind_named

    target = tiny_gpt_oss(seed=0)
    for kind, trained, good, bad, why in (
        (
            "dflash",
            [5],
            5,
            3,
            "this DFlash draft trained whole blocks of 6 only (train.block_lengths: full); a shorter block's "
            "slots see fewer mask slots than in training: serve k = 5, or train it with train.block_lengths: "
            "random",
        ),
        (
            "peagle",
            [1, 2, 3],
            2,
            4,
            "this P-EAGLE draft trained 3 depths (train.ttt_steps=3); a depth past them is "
            "untrained: serve k <= 3",
        ),
    ):
        draft = draft_for(target, 0, kind=kind)
        Engine(target, draft, TreeShape.chain(bad), max_batch=2)  # no record: runs
        draft.config.trained_k = trained
        Engine(target, draft, TreeShape.chain(good), max_batch=2)
        with pytest.raises(ValueError) as e:
            Engine(target, draft, TreeShape.chain(bad), max_batch=2)
        assert str(e.value) == f"k={bad}: {why}"
        ckpt = save_draft(draft, tmp_path / kind, dtype=torch.float32)
        settings = dict(trees=None, concurrency=None, temperatures=None, servers=None)
        resolve_settings(Recipe(), tmp_path, [("d", str(ckpt))], [good], **settings)
        with pytest.raises(InputError) as e:  # eval: before the target loads
            resolve_settings(Recipe(), tmp_path, [("d", str(ckpt))], [good, bad], **settings)
        assert str(e.value) == f"eval --draft d ({ckpt}): k={bad}: {why}"
        with pytest.raises(InputError) as e:  # eyas serve: before the target loads
            build_served(Recipe(), str(ckpt), TreeShape.chain(bad))
        assert str(e.value) == f"--draft {ckpt}: k={bad}: {why}"
    assert Recipe.model_validate({"draft": {"kind": "dflash"}}).eval.k == 15
    shorter = {"draft": {"kind": "dflash", "block_size": 6}, "train": {"block_lengths": "random"}}
    random = Recipe.model_validate({**shorter, "eval": {"k": 3}})
    assert kind_named("dflash").trained_k(random.train) == list(range(1, 6))
    with pytest.raises((RecipeError, ValueError), match=r"train\.block_lengths: random is a DFlash draft's"):
        Recipe.model_validate({"train": {"block_lengths": "random"}})
    with pytest.raises((RecipeError, ValueError), match=r"eval\.more_k\[0\]: k=7: this DFlash draft trained"):
        Recipe.model_validate({"draft": {"kind": "dflash"}, "eval": {"more_k": [7]}})


def test_k_advice_offers_only_the_rounds_the_draft_trained():
    """eval/advice.py reads every shorter chain's tau off the longest measured chain; for a DFlash draft that
    trained whole blocks of 8 only (trained_k [7]) the shorter chains are rounds it would refuse, so k = 7 is
    its only candidate; trained with random block lengths (1 .. 7), or unrecorded, every k up to 7 is."""
    from eyas.eval import advice

    pp = [0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01]
    entry = {"k": 7, "tree": None, "target_forwards": 10, "per_position_acceptance": pp}
    for kind, trained, ks in (
        ("dflash", [7], [7]),
        ("dflash", list(range(1, 8)), list(range(1, 8))),
        ("dflash", None, list(range(1, 8))),
        ("eagle3", None, list(range(1, 8))),
    ):
        cands = advice.candidate_taus([{**entry, "draft_kind": kind, "trained_k": trained}])
        assert sorted(shape.steps for shape, _ in cands.values()) == ks
        assert cands[f"k={ks[0]}"][1] == pytest.approx(1.0 + sum(pp[: ks[0]]))
