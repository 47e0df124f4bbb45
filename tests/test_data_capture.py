"""The capture stage on a tiny random 6-layer gpt-oss target: exact hidden states, the shard
format round trip, resume after a crash, and the lm_head check."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from data_fixtures import make_tiny_target, one_thread, write_prompts  # noqa: F401  (one_thread: fixture)
from safetensors.torch import load_file

import eyas.data.capture as capture
from eyas.data.capture import LAYER_ID_CONVENTION, capture_batch, run_capture
from eyas.data.prompts import run_prompts
from eyas.data.regenerate import loss_mask, read_sequences, run_regenerate
from eyas.data.shards import ShardDataset
from eyas.data.target import load_target, tapped
from eyas.recipes.load import load_recipe
from eyas.train.packing import collate_rows

pytestmark = pytest.mark.usefixtures("one_thread")
N_LAYERS = 6
IDS = [0, 2, N_LAYERS - 1]


@pytest.fixture(scope="module")
def regen_run(tmp_path_factory, one_thread):
    """A run directory whose prompts and regen stages are done (10 sequences)."""
    root = tmp_path_factory.mktemp("capture")
    target = make_tiny_target(root / "target", num_layers=N_LAYERS)
    prompts = write_prompts(root / "prompts.jsonl", 12)
    r = load_recipe(
        {
            "target": {"model": str(target), "dtype": "float32", "device": "cpu"},
            "data": {"prompts": str(prompts), "num_eval_prompts": 2, "max_new_tokens": 12},
        }
    )
    run_prompts(r, root / "run", progress=False)
    run_regenerate(r, root / "run", progress=False)
    return target, root / "run"


def fresh_run(regen_run, tmp_path, name="run"):
    shutil.copytree(regen_run[1], tmp_path / name)
    return tmp_path / name


def recipe(target, **cap):
    return load_recipe(
        {
            "target": {"model": str(target), "dtype": "float32", "device": "cpu"},
            "capture": {"aux_layer_ids": IDS, "dtype": "float32", **cap},
            "vocab": {"draft_vocab_size": 32},
        }
    )


def reference(model, ids):
    """output_hidden_states of one unpadded sequence: ids (T,) -> hidden_states tuple, logits."""
    with torch.no_grad():
        out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    return out.hidden_states, out.logits


def test_last_layer_id_is_the_pre_norm_output(regen_run):
    """id N (the target's layer count) = the output of the last decoder layer BEFORE the final norm
    (vLLM boundary numbering), which HF's hidden_states[N] (after the norm) is not."""
    target, run = regen_run
    model, _ = load_target(str(target), "float32", "cpu")
    ids = torch.tensor([read_sequences(run)[0]["input_ids"]])
    pre_norm = {}
    handle = model.model.norm.register_forward_pre_hook(lambda m, args: pre_norm.update(x=args[0]))
    try:
        with tapped(model, [2, N_LAYERS]) as tap:
            aux, final, _ = capture_batch(model, tap, ids, torch.ones_like(ids))
    finally:
        handle.remove()
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    assert torch.equal(aux[..., :64], out.hidden_states[2])
    assert torch.equal(aux[..., 64:], pre_norm["x"])
    assert not torch.allclose(aux[..., 64:], out.hidden_states[N_LAYERS], atol=1e-3)  # that one is post-norm
    with torch.no_grad():
        torch.testing.assert_close(model.model.norm(aux[..., 64:]), final, rtol=0, atol=0)
    with pytest.raises(ValueError, match=f"ids run 0..{N_LAYERS}"):
        tapped(model, [N_LAYERS + 1]).__enter__()


def test_capture_batch_equals_hidden_states_exactly(regen_run):
    target, run = regen_run
    model, _ = load_target(str(target), "float32", "cpu")
    seqs = read_sequences(run)[:3]
    T = max(len(s["input_ids"]) for s in seqs)
    ids = torch.zeros((3, T), dtype=torch.long)
    mask = torch.zeros((3, T), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s["input_ids"])] = torch.tensor(s["input_ids"])
        mask[b, : len(s["input_ids"])] = 1
    with tapped(model, IDS) as tap:
        aux, final, logits = capture_batch(model, tap, ids, mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    assert (
        len(out.hidden_states) == N_LAYERS + 1 and aux.shape == (3, T, 3 * 64) and final.shape == (3, T, 64)
    )
    for j, k in enumerate(IDS):  # id k = input of decoder layer k = hidden_states[k], 0 and N-1 included
        assert torch.equal(aux[..., j * 64 : (j + 1) * 64], out.hidden_states[k]), f"aux layer id {k}"
    assert torch.equal(final, out.hidden_states[N_LAYERS])  # post-norm
    assert torch.equal(logits, out.logits)
    with torch.no_grad():
        assert torch.equal(model.lm_head(final), out.logits)


def test_run_capture_round_trip(regen_run, tmp_path, capsys):
    target, run = regen_run[0], fresh_run(regen_run, tmp_path, "run2")
    stats = run_capture(recipe(target, batch_size=1, shard_tokens=100), run, progress=False)
    seqs = sorted(read_sequences(run), key=lambda s: len(s["input_ids"]))  # capture order: shortest first
    n_tok = sum(len(s["input_ids"]) for s in seqs)
    index = json.loads((run / "capture" / "index.json").read_text())
    assert index["aux_layer_ids"] == IDS and index["layer_id_convention"] == LAYER_ID_CONVENTION
    assert (index["hidden_size"], index["dtype"], index["target"]) == (64, "float32", str(target))
    assert index["num_sequences"] == stats["num_sequences"] == 10 and index["num_tokens"] == n_tok
    assert len(index["shards"]) == stats["num_shards"] >= 3
    assert all(s["num_tokens"] >= 100 for s in index["shards"][:-1])  # a shard closes at shard_tokens
    stored = 0
    for s in index["shards"]:
        t = load_file(run / "capture" / s["file"])
        assert t["aux"].dtype == t["final"].dtype == torch.float32
        assert (t["input_ids"].dtype, t["loss_mask"].dtype, t["offsets"].dtype) == (
            torch.int32,
            torch.uint8,
            torch.int64,
        )
        assert t["offsets"][0] == 0 and t["offsets"][-1] == s["num_tokens"] == len(t["input_ids"])
        assert len(t["offsets"]) == s["num_sequences"] + 1
        stored += sum(x.numel() * x.element_size() for x in t.values())
    assert stats["bytes_per_token"] == index["bytes_per_token"] == stored / n_tok
    assert f"{stored / n_tok:.1f} bytes/token" in capsys.readouterr().out

    model, _ = load_target(str(target), "float32", "cpu")
    ds = ShardDataset(run / "capture")
    assert len(ds) == 10 and ds.lengths == [len(s["input_ids"]) for s in seqs]
    for item, seq in zip(ds, seqs):
        ids = torch.tensor(seq["input_ids"])
        hs, logits = reference(model, ids)
        assert torch.equal(item["input_ids"], ids) and item["input_ids"].dtype == torch.int64
        assert torch.equal(item["loss_mask"], torch.tensor(loss_mask(seq), dtype=torch.float32))
        for j, k in enumerate(IDS):
            assert torch.equal(item["aux"][:, j * 64 : (j + 1) * 64], hs[k][0]), f"aux layer id {k}"
        assert torch.equal(item["final"], hs[N_LAYERS][0])
        with torch.no_grad():
            assert torch.equal(model.lm_head(item["final"]), logits[0])

    batch = collate_rows([[ds[0]], [ds[9]], [ds[4]]], max_length=20)
    lengths = [min(n, 20) for n in (ds.lengths[0], ds.lengths[9], ds.lengths[4])]
    assert batch["lengths"].tolist() == lengths and batch["aux"].shape == (3, max(lengths), 192)
    assert batch["final"].shape == (3, max(lengths), 64) and batch["input_ids"].shape == (3, max(lengths))
    for b, i in enumerate((0, 9, 4)):
        L = lengths[b]
        assert torch.equal(batch["aux"][b, :L], ds[i]["aux"][:L]) and not batch["aux"][b, L:].any()
        assert torch.equal(batch["input_ids"][b, :L], ds[i]["input_ids"][:L])
        assert (
            torch.equal(batch["loss_mask"][b, :L], ds[i]["loss_mask"][:L])
            and not batch["loss_mask"][b, L:].any()
        )
        assert batch["doc_ids"][b].tolist() == [0] * L + [1] * (max(lengths) - L)


def shard_tensors(run):
    index = json.loads((run / "capture" / "index.json").read_text())
    return index, [load_file(run / "capture" / s["file"]) for s in index["shards"]]


def test_resume_after_crash_is_identical(regen_run, tmp_path, monkeypatch):
    target = regen_run[0]
    r = recipe(target, batch_size=3, shard_tokens=60, dtype="bfloat16")
    full = fresh_run(regen_run, tmp_path, "full")
    run_capture(r, full, progress=False)

    crashed = fresh_run(regen_run, tmp_path, "crashed")
    real = capture.write_shard
    calls = []

    def crash_on_second_shard(path, packed, lengths):
        calls.append(path.name)
        entry = real(path, packed, lengths)
        if len(calls) == 2:  # the shard is on disk, the index not yet updated: a crash in between
            (path.parent / f".{path.name}.junk.tmp").write_text("half written")
            raise KeyboardInterrupt("simulated crash")
        return entry

    monkeypatch.setattr(capture, "write_shard", crash_on_second_shard)
    with pytest.raises(KeyboardInterrupt):
        run_capture(r, crashed, progress=False)
    index, _ = shard_tensors(crashed)
    assert [s["file"] for s in index["shards"]] == ["shard-00000.safetensors"]
    assert not (crashed / "capture" / "DONE.json").exists()

    monkeypatch.setattr(capture, "write_shard", real)
    run_capture(r, crashed, progress=False)
    (i_full, t_full), (i_res, t_res) = shard_tensors(full), shard_tensors(crashed)
    assert i_full == i_res and len(t_full) >= 3
    for a, b in zip(t_full, t_res):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert t_full[0]["aux"].dtype == torch.bfloat16
    assert not list((crashed / "capture").glob("*.tmp")) and not list((crashed / "capture").glob(".*.tmp"))

    # padded batches (batch_size 3) agree with the unpadded reference up to rounding to bf16
    model, _ = load_target(str(target), "float32", "cpu")
    item = ShardDataset(crashed / "capture")[9]
    hs, _ = reference(model, item["input_ids"])
    torch.testing.assert_close(item["final"], hs[N_LAYERS][0].to(torch.bfloat16), atol=0, rtol=1e-2)


def test_lm_head_check_raises_when_final_is_not_what_logits_come_from(regen_run, tmp_path, monkeypatch):
    target, run = regen_run[0], fresh_run(regen_run, tmp_path)
    real_load = capture.load_recipe_target

    def load_softcapped(*args, **kwargs):
        """Logits soft-capped after lm_head: the hook's final state no longer explains them."""
        model, tok = real_load(*args, **kwargs)
        forward = model.forward

        def capped(*a, **k):
            out = forward(*a, **k)
            out.logits = 3.0 * torch.tanh(out.logits / 3.0)
            return out

        model.forward = capped
        return model, tok

    monkeypatch.setattr(capture, "load_recipe_target", load_softcapped)
    with pytest.raises(
        RuntimeError,
        match=rf"target {target}: lm_head\(captured final state\) does not reproduce "
        r"the target's logits: max abs diff \d",
    ):
        run_capture(recipe(target), run, progress=False)
    assert not list((run / "capture").glob("shard-*"))


def test_lm_head_check_sees_a_bounded_slice_and_later_forwards_no_logits(regen_run, tmp_path, monkeypatch):
    """Full logits (B, T, V) come from one forward of at most VERIFY_SEQUENCES x VERIFY_TOKENS positions, not
    from a capture batch (16 sequences of ~2,200 tokens of SmolLM2's 49K vocab took 24 GB in the check)."""
    target, run = regen_run[0], fresh_run(regen_run, tmp_path)
    monkeypatch.setattr(capture, "VERIFY_SEQUENCES", 2)
    monkeypatch.setattr(capture, "VERIFY_TOKENS", 5)
    shapes, real_capture_batch = [], capture.capture_batch

    def recording(model, tap, ids, mask):
        aux, final, logits = real_capture_batch(model, tap, ids, mask)
        shapes.append((tuple(ids.shape), None if logits is None else tuple(logits.shape)))
        return aux, final, logits

    monkeypatch.setattr(capture, "capture_batch", recording)
    run_capture(recipe(target, batch_size=4), run, progress=False)
    assert shapes[0] == ((2, 5), (2, 5, 68))  # the check: 2 sequences x 5 tokens, the whole vocab
    assert len(shapes) == 1 + 3 and all(
        logits is None for _, logits in shapes[1:]
    )  # 10 sequences, batches of 4
    assert [ids[0] for ids, _ in shapes[1:]] == [4, 4, 2]


@pytest.mark.parametrize("aux_format", ["fp8", "int6", "int4"])
def test_compact_capture_decodes_within_its_stated_error(regen_run, tmp_path, aux_format):
    """`capture.aux_format: fp8 | int4` and `teacher: topk` (data/compact.py): the shards hold the stated
    bytes
    per token; decoded aux states are within the format's error of HF hidden_states[k] (fp8 e4m3: 1/16 of
    each value, plus 2^-9 of its aux state's max for the subnormal range; int6 / int4: half a step, step =
    the block's max / 31 or / 7); the teacher is the target's exact top-k over its whole vocabulary."""
    from eyas.data.compact import BLOCK, LEVELS, bytes_per_token

    target, run = regen_run[0], fresh_run(regen_run, tmp_path, f"compact-{aux_format}")
    k = 5
    stats = run_capture(
        recipe(target, aux_format=aux_format, teacher="topk", teacher_topk=k), run, progress=False
    )
    index = json.loads((run / "capture" / "index.json").read_text())
    assert (index["aux_format"], index["teacher"], index["teacher_topk"]) == (aux_format, "topk", k)
    n_tok = index["num_tokens"]
    offsets_bytes = sum(8 * (s["num_sequences"] + 1) for s in index["shards"])
    assert (
        stats["bytes_per_token"] * n_tok
        == bytes_per_token(3, 64, aux_format, "topk", k, 4) * n_tok + offsets_bytes
    )
    for s in index["shards"]:
        t = load_file(run / "capture" / s["file"])
        assert (
            "final" not in t
            and t["teacher_ids"].dtype == torch.int32
            and t["teacher_logprobs"].dtype == torch.float16
        )
        assert t["aux"].dtype == (torch.float8_e4m3fn if aux_format == "fp8" else torch.uint8)
        assert t["aux"].shape[1] == {"fp8": 192, "int6": 144, "int4": 96}[aux_format]

    model, _ = load_target(str(target), "float32", "cpu")
    seqs = sorted(read_sequences(run), key=lambda s: len(s["input_ids"]))
    ds = ShardDataset(run / "capture")
    for item, seq in zip(ds, seqs):
        ids = torch.tensor(seq["input_ids"])
        hs, logits = reference(model, ids)
        assert item["aux"].dtype == torch.float32 and item["aux"].shape == (len(ids), 3 * 64)
        for j, layer in enumerate(IDS):
            x, dec = hs[layer][0], item["aux"][:, j * 64 : (j + 1) * 64]  # (T, 64)
            err = (dec - x).abs()
            if aux_format == "fp8":
                bound = x.abs() / 16 + x.abs().amax(-1, keepdim=True) * 2**-9
            else:
                step = (
                    x.view(len(ids), -1, BLOCK).abs().amax(-1, keepdim=True) / LEVELS[aux_format]
                )  # (T, 2, 1)
                bound = (step * 0.502).expand(-1, -1, BLOCK).reshape(len(ids), 64)  # 0.002: the bf16 scale
            assert (err <= bound + 1e-7).all(), f"aux layer id {layer}: max excess {(err - bound).max()}"
            assert err.max() > 0  # it is quantised
        top = torch.log_softmax(logits[0], -1).topk(k)
        assert torch.equal(item["teacher_ids"], top.indices)
        assert torch.allclose(item["teacher_logprobs"], top.values, atol=2e-2, rtol=1e-3)  # fp16


def test_topk_teacher_with_the_whole_vocab_is_the_final_state_teacher():
    """train/ttt.topk_view with k = V gives target_view's draft-vocab distribution, argmax and in-draft
    flags."""
    from eyas.data.compact import topk_teacher
    from eyas.train.kinds.config import DraftConfig
    from eyas.train.model import Eagle3Draft
    from eyas.train.ttt import target_view, topk_view

    torch.manual_seed(0)
    V, H, V_d = 50, 16, 20
    cfg = DraftConfig(
        hidden_size=H,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=V,
        draft_vocab_size=V_d,
        aux_layer_ids=[0, 1, 2],
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    draft = Eagle3Draft(cfg)
    keep = torch.randperm(V)[:V_d].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[keep] = True
    draft.set_vocab_map(keep - torch.arange(V_d), t2d)
    final, w = torch.randn(2, 7, H), torch.randn(V, H)
    ref = target_view(final, w, draft)
    top = topk_teacher(final.view(14, H), w, V)
    got = topk_view(
        top["teacher_ids"].long().view(2, 7, V), top["teacher_logprobs"].float().view(2, 7, V), draft
    )
    assert torch.equal(got.argmax, ref.argmax) and torch.equal(got.in_draft, ref.in_draft)
    assert torch.allclose(got.probs, ref.probs, atol=2e-3)  # the log-probs are stored in fp16
    assert got.probs.shape == (2, 7, V_d)


def train_first_steps(regen_run, tmp_path, **capture_keys) -> tuple[list[dict], Path]:
    """capture (fp32), vocab, 3 training steps on the capture fixture's run -> (log lines, run dir)."""
    from eyas.data.vocab import run_vocab
    from eyas.train.trainer import run_train

    target = regen_run[0]
    run = fresh_run(regen_run, tmp_path, "train-" + "-".join(f"{k}-{v}" for k, v in capture_keys.items()))
    r = load_recipe(
        {
            "target": {"model": str(target), "dtype": "float32", "device": "cpu"},
            "data": {"num_eval_prompts": 2, "max_new_tokens": 12},
            "capture": {"aux_layer_ids": IDS, "dtype": "float32", **capture_keys},
            "vocab": {"draft_vocab_size": 32},
            "train": {
                "max_steps": 3,
                "batch_size": 2,
                "ttt_steps": 2,
                "lr": 1e-3,
                "val_fraction": 0.2,
                "log_every": 1,
            },
            "eval": {"k": 2},
        }
    )
    run_capture(r, run, progress=False)
    run_vocab(r, run, progress=False)
    run_train(r, run, progress=False)
    return [json.loads(x) for x in (run / "train" / "log.jsonl").read_text().splitlines()], run


@pytest.fixture(scope="module")
def final_teacher_log(regen_run, tmp_path_factory):
    return train_first_steps(regen_run, tmp_path_factory.mktemp("final"))[0]


def test_training_on_a_whole_vocab_topk_teacher_equals_the_final_state_teacher(
    regen_run, tmp_path, final_teacher_log
):
    """The trainer reads the top-k teacher (k = the whole vocabulary here) as it reads the final state: the
    first step's loss within 1e-3 (relative; the log-probs are stored in fp16) and the same accuracies.
    (Later steps are not compared: Adam's first steps turn tiny gradient differences into +-lr.)"""
    from transformers import AutoConfig

    V = AutoConfig.from_pretrained(str(regen_run[0])).vocab_size
    a, b = train_first_steps(regen_run, tmp_path, teacher="topk", teacher_topk=V)[0][0], final_teacher_log[0]
    assert a["step"] == b["step"] == 1
    assert (
        a["loss"] == pytest.approx(b["loss"], rel=1e-3)
        and a["acc"] == b["acc"]
        and a["cond_acc"] == b["cond_acc"]
    )
    assert a["step_loss"] == pytest.approx(b["step_loss"], rel=1e-3)


def test_online_mode_stores_nothing_and_trains_as_the_offline_capture(regen_run, tmp_path, final_teacher_log):
    """`capture.mode: online`: no shard is written, the target runs inside training (train/online.py), and
    every
    training step and the validation see what the offline capture stored: losses within 1e-5 (relative; the
    target runs on other batches, fp32), the same accuracies."""
    log, run = train_first_steps(regen_run, tmp_path, mode="online")
    assert not list((run / "capture").glob("*.safetensors"))
    index = json.loads((run / "capture" / "index.json").read_text())
    assert index["mode"] == "online" and index["shards"] == [] and index["num_sequences"] == 10
    assert len(log) == len(final_teacher_log) == 4  # 3 steps and the final validation
    for a, b in zip(log, final_teacher_log):
        a, b = a.get("val", a), b.get("val", b)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["acc"] == b["acc"] and a["cond_acc"] == b["cond_acc"]


def test_a_shard_buffer_copies_each_rows_own_tokens_into_tensors_it_reuses():
    """A shard's rows are copied as they come into the buffer's own tensors (allocated once, at the first
    row, `capacity` tokens), neither kept as views of the forward's padded (B, T, ...) batch (which would
    keep every batch's padding alive until the shard is written) nor as a tensor per sequence to concatenate
    (a shard's bytes twice, and a heap that grew shard after shard); the next shard reuses the tensors; the
    values are the batch's own tokens."""
    from types import SimpleNamespace

    from eyas.data.shards import ShardBuffer

    stored = {"aux": torch.randn(2, 10, 6), "final": torch.randn(2, 10, 3)}
    batch = [{"input_ids": [5, 6, 7], "prompt_len": 1}, {"input_ids": list(range(10)), "prompt_len": 4}]
    buf = ShardBuffer(16)
    out = SimpleNamespace(add=lambda row, n: buf.add(row))
    bar = SimpleNamespace(update=lambda n: None)
    added = capture._add_batch(out, batch, 0, 0, [stored, stored], SimpleNamespace(shard_tokens=64), bar)
    assert added == 13 and buf.lengths == [3, 10]
    packed = buf.packed()
    for name, x in stored.items():
        assert torch.equal(packed[name], torch.cat([x[0, :3], x[1, :10]]))
        assert packed[name].untyped_storage().nbytes() == 16 * x.shape[-1] * 4, name  # the buffer's own
    assert packed["input_ids"].tolist() == [5, 6, 7, *range(10)] and packed["input_ids"].dtype == torch.int32
    assert packed["loss_mask"].tolist() == loss_mask(batch[0]) + loss_mask(batch[1])
    where = {k: t.data_ptr() for k, t in buf.tensors.items()}
    buf.clear()
    capture._add_batch(out, batch[1:], 0, 0, [stored], SimpleNamespace(shard_tokens=64), bar)
    assert {k: t.data_ptr() for k, t in buf.tensors.items()} == where and buf.lengths == [10]
    assert torch.equal(buf.packed()["aux"], stored["aux"][0, :10])  # the first stored row of this batch


def test_a_shard_buffer_refuses_a_row_it_would_store_wrongly(tmp_path):
    """A slice copy would broadcast a row of one token over T, cast another dtype, or leave a missing key's
    bytes from the shard before: each is refused with the key and shapes; a buffer that is full refuses
    the row that does not fit, and a shard's lengths must sum to its tokens."""
    from eyas.data.shards import ShardBuffer, write_shard

    def row(T, aux=None, **drop):
        r = {
            "aux": torch.zeros(T, 4) if aux is None else aux,
            "input_ids": torch.arange(T),
            "loss_mask": torch.ones(T),
        }
        return {k: v for k, v in r.items() if k not in drop}

    buf = ShardBuffer(8)
    buf.add(row(3))
    bad = [
        (row(3, aux=torch.zeros(1, 4)), "aux: a row of \\(1, 4\\)"),
        (row(3, aux=torch.zeros(3, 4, dtype=torch.float64)), "torch.float64"),
        (row(3, loss_mask=True), "this shard's rows hold"),
    ]
    for r, match in bad:
        with pytest.raises(ValueError, match=match):
            buf.add(r)
    with pytest.raises(RuntimeError, match="a shard buffer of 8 tokens cannot take 3 \\+ 6"):
        buf.add(row(6))
    assert buf.lengths == [3] and buf.tokens == 3
    with pytest.raises(ValueError, match="lengths sum to 4, the tensors hold 3"):
        write_shard(tmp_path / "shard-00000.safetensors", buf.packed(), [4])
    assert not list(tmp_path.iterdir())
