"""The capture stage on a tiny random 6-layer gpt-oss target: exact hidden states, the shard
format round trip, resume after a crash, and the lm_head check."""

import json
import shutil

import pytest
import torch
from data_fixtures import make_tiny_target, one_thread, write_prompts  # noqa: F401  (one_thread: fixture)
from safetensors.torch import load_file

import eyas.data.capture as capture
from eyas.data.capture import LAYER_ID_CONVENTION, capture_batch, run_capture
from eyas.data.prompts import run_prompts
from eyas.data.regenerate import loss_mask, read_sequences, run_regenerate
from eyas.data.shards import ShardDataset
from eyas.train.packing import collate_rows
from eyas.data.target import load_target, tapped
from eyas.recipes.schema import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")
N_LAYERS = 6
IDS = [0, 2, N_LAYERS - 1]


@pytest.fixture(scope="module")
def regen_run(tmp_path_factory, one_thread):
    """A run directory whose prompts and regen stages are done (10 sequences)."""
    root = tmp_path_factory.mktemp("capture")
    target = make_tiny_target(root / "target", num_layers=N_LAYERS)
    prompts = write_prompts(root / "prompts.jsonl", 12)
    r = load_recipe({"target": {"model": str(target), "dtype": "float32", "device": "cpu"},
                     "data": {"prompts": str(prompts), "num_eval_prompts": 2, "max_new_tokens": 12}})
    run_prompts(r, root / "run", progress=False)
    run_regenerate(r, root / "run", progress=False)
    return target, root / "run"


def fresh_run(regen_run, tmp_path, name="run"):
    shutil.copytree(regen_run[1], tmp_path / name)
    return tmp_path / name


def recipe(target, **cap):
    return load_recipe({"target": {"model": str(target), "dtype": "float32", "device": "cpu"},
                        "capture": {"aux_layer_ids": IDS, "dtype": "float32", **cap},
                        "vocab": {"draft_vocab_size": 32}})


def reference(model, ids):
    """output_hidden_states of one unpadded sequence: ids (T,) -> hidden_states tuple, logits."""
    with torch.no_grad():
        out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    return out.hidden_states, out.logits


def test_capture_batch_equals_hidden_states_exactly(regen_run):
    target, run = regen_run
    model, _ = load_target(str(target), "float32", "cpu")
    seqs = read_sequences(run)[:3]
    T = max(len(s["input_ids"]) for s in seqs)
    ids = torch.zeros((3, T), dtype=torch.long)
    mask = torch.zeros((3, T), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s["input_ids"])] = torch.tensor(s["input_ids"])
        mask[b, :len(s["input_ids"])] = 1
    with tapped(model, IDS) as tap:
        aux, final, logits = capture_batch(model, tap, ids, mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    assert len(out.hidden_states) == N_LAYERS + 1 and aux.shape == (3, T, 3 * 64) and final.shape == (3, T, 64)
    for j, k in enumerate(IDS):  # id k = input of decoder layer k = hidden_states[k], 0 and N-1 included
        assert torch.equal(aux[..., j * 64:(j + 1) * 64], out.hidden_states[k]), f"aux layer id {k}"
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
        assert (t["input_ids"].dtype, t["loss_mask"].dtype, t["offsets"].dtype) == (torch.int32, torch.uint8,
                                                                                   torch.int64)
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
            assert torch.equal(item["aux"][:, j * 64:(j + 1) * 64], hs[k][0]), f"aux layer id {k}"
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
        assert torch.equal(batch["loss_mask"][b, :L], ds[i]["loss_mask"][:L]) and not batch["loss_mask"][b, L:].any()
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

    def crash_on_second_shard(path, seqs):
        calls.append(path.name)
        entry = real(path, seqs)
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
    real_load = capture.load_target

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

    monkeypatch.setattr(capture, "load_target", load_softcapped)
    with pytest.raises(RuntimeError, match=rf"target {target}: lm_head\(captured final state\) does not reproduce "
                                           r"the target's logits: max abs diff \d"):
        run_capture(recipe(target), run, progress=False)
    assert not list((run / "capture").glob("shard-*"))
