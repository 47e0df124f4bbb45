"""O(T)-memory TTT attention and sequence packing change memory, not math.

* chunked (online softmax over tiles, recomputed in backward) and sdpa (torch's flash CPU kernel per
  document run, merged with the chain diagonals by log-sum-exp) == dense: output, TTT loss and every
  parameter gradient, in fp32 within 1e-5 relative, with GQA, several tiles, padding and packing;
* a packed row gives each of its sequences exactly the logits, counts and losses that sequence gets
  alone (positions restart, no attention across sequences, no prediction across a boundary);
* the packing plan fits rows to max_length and is deterministic.
The flex (GPU) path is held to the same equalities in tests/test_gpu.py.
"""

import pytest
import torch
from test_train_serve_consistency import make_draft

from eyas.train import attention as A
from eyas.train.packing import collate_rows, cut_note, doc_ids_from_lengths, plan_rows, positions_in_doc
from eyas.train.ttt import TargetView, ttt_forward


def packed_docs(B, T, g):
    """Random non-decreasing doc ids per row, with a padding document at the end of row 1."""
    doc = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        cuts = sorted(torch.randperm(T - 2, generator=g)[:3].add(1).tolist())
        for c in cuts:
            doc[b, c:] += 1
    doc[1, T - 5 :] = doc[1, T - 6] + 1
    return doc


def outputs_and_grads(runs, q, keys, values, doc, w):
    """[(impl, window)] -> per run [output, then the gradients of q, keys, values] of sum(o * w)."""
    out = []
    for name, window in runs:
        o = A.ttt_attention(name, q, keys, values, doc, 0.3, window)
        (o * w).sum().backward()
        out.append([o.detach()] + [t.grad.clone() for t in (q, *keys, *values)])
        for t in (q, *keys, *values):
            t.grad = None
    return out


@pytest.mark.parametrize(
    "impl,tile", [("chunked", 4), ("chunked", 7), ("chunked", 64), ("sdpa", None), ("sdpa-unpacked", None)]
)
def test_o_t_attention_equals_dense(impl, tile, monkeypatch):
    monkeypatch.setattr(A, "tile_size", lambda *a: tile)
    g = torch.Generator().manual_seed(tile or 3)
    B, nh, nkv, T, d = 2, 6, 2, 29, 8
    doc = packed_docs(B, T, g)
    if impl == "sdpa-unpacked":  # every row one document plus the same padding: one kernel call per run
        impl, doc = "sdpa", (torch.arange(T) >= T - 4).long().expand(B, T)
    for n_steps in (1, 2, 4):
        q = torch.randn(B, nh, T, d, generator=g, requires_grad=True)
        keys = [torch.randn(B, nkv, T, d, generator=g, requires_grad=True) for _ in range(n_steps)]
        values = [torch.randn(B, nkv, T, d, generator=g, requires_grad=True) for _ in range(n_steps)]
        w = torch.randn(B, nh, T, d, generator=g)
        ref, got = outputs_and_grads([("dense", None), (impl, None)], q, keys, values, doc, w)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", [4, 7])
def test_chunked_sliding_window_equals_dense_and_drops_old_keys(tile, monkeypatch):
    """draft.sliding_window: chunked (skipping tiles wholly older than the window) == dense in output and
    gradients, and the window changes the output (dense without it); sdpa refuses a window, auto takes
    chunked for it on CPU."""
    monkeypatch.setattr(A, "tile_size", lambda *a: tile)
    g = torch.Generator().manual_seed(tile)
    B, nh, nkv, T, d, W = 2, 6, 2, 29, 8, 6
    doc = packed_docs(B, T, g)
    for n_steps in (1, 3):
        q = torch.randn(B, nh, T, d, generator=g, requires_grad=True)
        keys = [torch.randn(B, nkv, T, d, generator=g, requires_grad=True) for _ in range(n_steps)]
        values = [torch.randn(B, nkv, T, d, generator=g, requires_grad=True) for _ in range(n_steps)]
        w = torch.randn(B, nh, T, d, generator=g)
        runs = [("dense", W), ("chunked", W), ("dense", None)]
        ref, got, full = outputs_and_grads(runs, q, keys, values, doc, w)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert (ref[0] - full[0]).abs().max() > 1e-3  # the window hid keys some queries saw without it
    with pytest.raises(ValueError, match="sdpa"):
        A.resolve("sdpa", torch.device("cpu"), W)
    assert A.resolve("auto", torch.device("cpu"), W) == "chunked"


def test_o_t_bf16_as_accurate_as_dense_bf16(monkeypatch):
    """In bf16 the chunked and sdpa paths' output and gradients are as close to the fp32 reference as the
    dense
    path's own bf16 run (at most 1.3x its error): forward and recomputing backward agree on precision.
    Short rows and peaked scores give the chain diagonals weight (a bf16 diagonal score in the forward
    against an fp32 one in the backward doubled the error of those steps' value gradients)."""
    monkeypatch.setattr(A, "tile_size", lambda *a: 8)
    g = torch.Generator().manual_seed(11)
    B, nh, nkv, T, d = 1, 4, 2, 12, 64
    doc = torch.zeros(B, T, dtype=torch.long)
    ref = [torch.randn(B, h, T, d, generator=g) for h in (nh, nkv, nkv, nkv, nkv, nkv, nkv)]
    w = torch.randn(B, nh, T, d, generator=g)

    def run(impl, dtype):
        t = [x.detach().to(dtype).requires_grad_() for x in ref]
        o = A.ttt_attention(impl, t[0], t[1:4], t[4:7], doc, 0.5)
        (o.float() * w).sum().backward()
        return [o.float()] + [x.grad.float() for x in t]

    exact = run("dense", torch.float32)
    err = {
        impl: [((a - e).norm() / e.norm()).item() for a, e in zip(run(impl, torch.bfloat16), exact)]
        for impl in ("dense", "chunked", "sdpa")
    }
    for impl in ("chunked", "sdpa"):
        for i, (c, dn) in enumerate(zip(err[impl], err["dense"])):
            assert c <= 1.3 * dn, (impl, i, c, dn)


def random_target(d, B, T, g):
    probs = torch.softmax(torch.randn(B, T, 40, generator=g) * 3, -1)
    in_draft = torch.rand(B, T, generator=g) > 0.2
    return TargetView(probs, d.to_target_ids(probs.argmax(-1)), in_draft)


def test_chunked_ttt_same_loss_and_grads(monkeypatch):
    """dense, chunked, sdpa, and chunked with each step's layer recomputed in backward: one loss, one
    gradient."""
    monkeypatch.setattr(A, "tile_size", lambda *a: 5)
    d = make_draft(5)
    d.train()
    g = torch.Generator().manual_seed(5)
    B, T = 2, 23
    ids = torch.randint(0, 97, (B, T), generator=g)
    aux = torch.randn(B, T, 96, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    doc = packed_docs(B, T, g)
    mask[doc == doc.max(dim=1, keepdim=True).values] = 0  # padding never counts
    target = random_target(d, B, T, g)
    runs = []
    for impl, ckpt in (
        ("dense", False),
        ("chunked", False),
        ("sdpa", False),
        ("chunked", True),
    ):  # ckpt: recompute the layer
        d.zero_grad()
        out = ttt_forward(d, aux, ids, mask, doc, target, ttt_steps=4, attention=impl, checkpoint_layer=ckpt)
        out.loss.backward()
        runs.append((out, {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}))
    dense, gd = runs[0]
    trainable = [n for n, p in d.named_parameters() if p.requires_grad]
    assert list(gd) == trainable and "embed_tokens.weight" not in gd  # every trainable tensor
    for other, go in runs[1:]:
        assert abs(dense.loss.item() - other.loss.item()) <= 1e-5 * abs(dense.loss.item())
        assert dense.step_count == other.step_count and dense.step_acc == other.step_acc
        assert list(go) == trainable
        for n in gd:
            torch.testing.assert_close(go[n], gd[n], rtol=1e-5, atol=1e-5 * gd[n].abs().max().item())


@pytest.mark.parametrize("attention", ["dense", "chunked", "sdpa"])
def test_packed_row_equals_sequences_alone(attention):
    d = make_draft(7)
    g = torch.Generator().manual_seed(7)
    lens = [9, 6, 11]
    seqs = [
        {
            "aux": torch.randn(n, 96, generator=g),
            "final": torch.zeros(n, 32),
            "input_ids": torch.randint(0, 97, (n,), generator=g),
            "loss_mask": (torch.rand(n, generator=g) > 0.2).float(),
        }
        for n in lens
    ]
    targets = [random_target(d, 1, n, g) for n in lens]
    row = collate_rows([seqs], max_length=32)
    assert row["doc_ids"][0].tolist() == [0] * 9 + [1] * 6 + [2] * 11
    assert positions_in_doc(row["doc_ids"])[0].tolist() == list(range(9)) + list(range(6)) + list(range(11))
    packed_target = TargetView(
        *(torch.cat([getattr(t, f) for t in targets], dim=1) for f in ("probs", "argmax", "in_draft"))
    )
    with torch.no_grad():
        packed = ttt_forward(
            d,
            row["aux"],
            row["input_ids"],
            row["loss_mask"],
            row["doc_ids"],
            packed_target,
            4,
            attention=attention,
            keep_logits=True,
        )
        alone = [
            ttt_forward(
                d,
                s["aux"][None],
                s["input_ids"][None],
                s["loss_mask"][None],
                torch.zeros(1, n, dtype=torch.long),
                t,
                4,
                attention=attention,
                keep_logits=True,
            )
            for s, t, n in zip(seqs, targets, lens)
        ]
    for j in range(4):
        assert packed.step_count[j] == sum(a.step_count[j] for a in alone) > 0
        start = 0
        for a, n in zip(alone, lens):
            keep = n - 1 - j  # later indices read a token past the sequence's end: never counted
            torch.testing.assert_close(
                packed.logits[j][0, start : start + keep], a.logits[j][0, :keep], atol=1e-5, rtol=0
            )
            start += n
    # the loss is the mean over trained positions of all sequences: the count-weighted mean of their losses
    # (step 0, where decay**0 = 1 and every sequence counts positions)
    n_tr = [
        (s["loss_mask"][2:].bool() & t.in_draft[0, 1 : n - 1]).sum().item()
        for s, t, n in zip(seqs, targets, lens)
    ]
    want = sum(a.step_loss[0] * k for a, k in zip(alone, n_tr)) / sum(n_tr)
    assert abs(packed.step_loss[0] - want) <= 1e-5


def test_padding_rows_and_doc_ids():
    assert doc_ids_from_lengths(torch.tensor([3, 5]), 5).tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    rows = collate_rows(
        [
            [
                {
                    "aux": torch.ones(4, 2),
                    "final": torch.ones(4, 1),
                    "input_ids": torch.arange(4),
                    "loss_mask": torch.ones(4),
                }
            ]
        ]
        * 2
        + [[]][:0],
        max_length=3,
    )
    assert rows["lengths"].tolist() == [3, 3] and rows["doc_ids"].tolist() == [[0, 0, 0]] * 2


def test_plan_rows_fits_and_is_deterministic():
    lengths = [int(x) for x in torch.randint(1, 100, (200,), generator=torch.Generator().manual_seed(0))]
    rows = plan_rows(lengths, 128, pack=True, seed=3)
    assert sorted(i for r in rows for i in r) == list(range(200))
    assert all(sum(min(lengths[i], 128) for i in r) <= 128 for r in rows)
    assert len(rows) <= 1.05 * sum(lengths) / 128 + 1  # best fit decreasing wastes little
    assert rows == plan_rows(lengths, 128, pack=True, seed=3)
    assert plan_rows(lengths, 128, pack=False) == [[i] for i in range(200)]
    assert plan_rows([500, 3], 128, pack=True) == [[0], [1]]  # a long sequence fills a row by itself (cut)


def test_pack_length_fills_short_rows_and_gives_long_sequences_their_own():
    """train.pack_length 32 under max_length 128: sequences up to 32 tokens share rows of at most 32; a longer
    one (cut to 128) is a row of its own, with no short sequence added after it."""
    lengths = [int(x) for x in torch.randint(1, 33, (100,), generator=torch.Generator().manual_seed(1))]
    lengths += [40, 90, 128, 300]
    rows = plan_rows(lengths, 128, pack=True, seed=0, pack_length=32)
    assert sorted(i for r in rows for i in r) == list(range(104))
    assert [r for r in rows if any(i >= 100 for i in r)] == [[103], [102], [101], [100]]
    assert all(sum(lengths[i] for i in r) <= 32 for r in rows if all(i < 100 for i in r))
    assert len(rows) <= 1.05 * sum(lengths[:100]) / 32 + 1 + 4
    assert plan_rows(lengths, 128, pack=True, seed=0, pack_length=128) == plan_rows(lengths, 128, True, 0)


def test_cut_note_counts_the_sequences_longer_than_a_row():
    assert cut_note([128, 3, 100], 128) is None
    note = cut_note([500, 3, 129], 128)
    assert note.startswith("2 of 3 training sequences are longer than train.max_length=128 (the longest 500")


@pytest.mark.parametrize("kind", ["kl", "lk", "ce"])
def test_ttt_loss_is_the_chosen_loss_over_the_trained_positions(kind):
    """train.loss reaches every step: each step's loss is the mean of `position_loss(kind)` of that step's
    logits over the trained positions (counted, target argmax in the draft vocab), summed with decay**j;
    a two-layer draft with norm_before_fc trains through the same path (every tensor gets a gradient)."""
    from eyas.train.loss import position_loss
    from eyas.train.packing import doc_ids_from_lengths

    d = make_draft(6, num_layers=2, norm_before_fc=True)
    d.train()
    g = torch.Generator().manual_seed(6)
    B, T, steps, decay = 2, 11, 3, 0.8
    ids = torch.randint(0, 97, (B, T), generator=g)
    aux = torch.randn(B, T, 96, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    target = random_target(d, B, T, g)
    out = ttt_forward(
        d,
        aux,
        ids,
        mask,
        doc_ids_from_lengths(torch.tensor([T, T]), T),
        target,
        ttt_steps=steps,
        decay=decay,
        keep_logits=True,
        loss=kind,
    )
    expected = 0.0
    for j in range(steps):
        L = T - 2 - j
        trained = mask[:, 2 + j :].bool() & target.in_draft[:, 1 + j : T - 1]
        per = position_loss(kind, out.logits[j][:, :L], target.probs[:, 1 + j : T - 1])
        expected = expected + decay**j * per[trained].mean()
    torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-6)
    out.loss.backward()
    assert all(
        p.grad is not None and p.grad.abs().sum() > 0 for n, p in d.named_parameters() if p.requires_grad
    )


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_chunked_backward_under_bf16_autocast(monkeypatch, norm_before_residual):
    """Under autocast the forward's tile matmuls run in bf16 while q and the keys may hold different dtypes;
    backward runs outside autocast and must recompute the scores in the forward's dtype (on an H200, a
    norm_before_residual draft failed here: "expected scalar type Float but found BFloat16"). Its gradients
    match the dense path's under the same autocast within bf16's error."""
    monkeypatch.setattr(A, "tile_size", lambda *a: 5)
    d = make_draft(7, norm_before_residual=norm_before_residual)
    d.train()
    g = torch.Generator().manual_seed(7)
    B, T = 2, 19
    ids = torch.randint(0, 97, (B, T), generator=g)
    aux = torch.randn(B, T, 96, generator=g)
    mask = torch.ones(B, T)
    doc = torch.zeros(B, T, dtype=torch.long)
    target = random_target(d, B, T, g)
    grads = {}
    for impl in ("dense", "chunked"):
        d.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ttt_forward(d, aux, ids, mask, doc, target, ttt_steps=3, attention=impl)
        out.loss.backward()
        grads[impl] = {n: p.grad.float().clone() for n, p in d.named_parameters() if p.grad is not None}
    for n, gd in grads["dense"].items():
        err = (grads["chunked"][n] - gd).norm() / gd.norm()
        assert err < 0.05, (n, err.item())


def test_replay_counts_the_greedy_loops_rounds():
    """train/validation.py `replay`: the first chain after the prefill's token, each next one after the
    accepted drafts and the bonus token; k caps a chain, the answer's end cuts it; a packed row's answers
    and a prompt's positions are kept apart."""
    from eyas.train.validation import answer_spans, replay

    # one answer at positions 2..7 (a = 2, b = 8): chains at i = 1, then as accepted
    runs = torch.tensor([[0, 2, 0, 1, 0, 0, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    docs = torch.zeros_like(mask)
    # k = 1: i=1 m=1, i=3 m=1, i=5 m=0 (i=6: none left); k = 2: i=1 m=2, i=4 m=0, i=5 m=0
    assert replay(runs, mask, docs, 2) == ([2, 2], [3, 3])
    # the answer's end cuts a run: i=1 may accept at most b-2-i = 1 of its 5
    assert replay(torch.tensor([[0, 5, 0, 0]]), torch.tensor([[0, 0, 1, 1]]), torch.zeros(1, 4), 3) == (
        [1, 1, 1],
        [1, 1, 1],
    )
    # two sequences packed in one row, the second's prompt (position 4) between: two separate answers
    runs = torch.tensor([[0, 1, 0, 0, 1, 1, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 0, 1, 1]])
    docs = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    # doc 0: a=1, b=4: i=0 m=0, i=1 m=1 (b-2-i=1) -> 1 accepted, 2 rounds; doc 1: a=5, b=7: i=4 m=1
    assert replay(runs, mask, docs, 1) == ([2], [3])
    # an answer from a sequence's first token on: its chains start inside it, not in the sequence before
    assert answer_spans([0, 1, 1, 1], [0, 1, 1, 1]) == [(2, 4)] and answer_spans([0, 1, 1], [0, 0, 0]) == [
        (1, 3)
    ]


def test_run_length_is_the_leading_right_steps_of_each_chain():
    """ttt_forward's run_length, which replay reads: at each index, how many steps in a row the draft's
    guess was the target's greedy token. The text is the draft's own step-0 guesses (so step 0 is always
    right and later steps sometimes), checked against the kept logits."""
    from eyas.train.validation import replay

    d = make_draft(15)
    g = torch.Generator().manual_seed(15)
    T, steps = 14, 4
    aux = torch.randn(1, T, 96, generator=g)
    ids = torch.randint(0, 97, (1, T), generator=g)
    docs = doc_ids_from_lengths(torch.tensor([T]), T)
    with torch.no_grad():
        for t in range(2, T):  # x_t: the draft's step-0 guess after x_0..x_{t-1} (index t - 2)
            logits = ttt_forward(d, aux[:, :t], ids[:, :t], torch.ones(1, t), docs[:, :t], None, 1)
            ids[0, t] = d.to_target_ids(logits.logits[0][0, t - 2].argmax())
        probs = torch.softmax(torch.randn(1, T, 40, generator=g), -1)
        argmax = torch.cat([ids[:, 1:], ids[:, :1]], 1)  # the text is greedy: z_t's argmax is x_{t+1}
        target = TargetView(probs, argmax, torch.ones(1, T, dtype=torch.bool))
        out = ttt_forward(d, aux, ids, torch.ones(1, T), docs, target, steps, keep_logits=True)
    expected = []
    for i in range(T):
        n = 0
        while (
            n < steps and i + 2 + n < T and d.to_target_ids(out.logits[n][0, i].argmax()) == ids[0, i + 2 + n]
        ):
            n += 1
        expected.append(n)
    assert out.run_length[0].tolist() == expected == [1, 1, 3, 2, 1, 1, 1, 2, 1, 1, 1, 1, 0, 0]
    # the loop on this text: k = 1 chains at i = 0, 2, .., 10 accept 1 each; k = 2 at 0, 2, 5, 7, 10 accept
    # 1, 2, 1, 2, 1; k = 3 at 0, 2, 6, 8, 10 accept 1, 3, 1, 1, 1 (i = 12: nothing left to draft)
    assert replay(out.run_length, torch.ones(1, T), docs, 3) == ([6, 7, 7], [6, 5, 5])
