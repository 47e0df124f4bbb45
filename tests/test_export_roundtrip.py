"""eyas -> published layout -> eyas gives identical logits, and exports refuse what engines cannot serve."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_export_support import YARN, make_draft, tiny_target

from eyas.cli import main
from eyas.serve.interchange import export as export_mod
from eyas.serve.interchange.export import ExportError, export, fixed_batch_outputs, main_export
from eyas.serve.interchange.importer import import_draft
from eyas.train.checkpoint import load_draft, save_draft


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("target"))


def saved(tmp_path, draft, name="ckpt"):
    return save_draft(draft, tmp_path / name, dtype=torch.float32)


def same_outputs(a, b):
    return all(torch.equal(x, y) for x, y in zip(fixed_batch_outputs(a), fixed_batch_outputs(b)))


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
@pytest.mark.parametrize("rope", [None, YARN])
def test_round_trip_identical_logits(tmp_path, target, fmt, rope):
    ckpt = saved(tmp_path, make_draft(0, target, rope))
    result = export(ckpt, fmt, tmp_path / "out", dtype="float32", num_speculative_tokens=5)
    # eagle3 names no target; speculators names it as verifier, so the import finds the embedding itself
    back = import_draft(tmp_path / "out", tmp_path / "back", target=str(target) if fmt == "eagle3" else None)
    a, b = load_draft(ckpt), load_draft(back)
    assert same_outputs(a, b)
    assert torch.equal(a.d2t, b.d2t) and torch.equal(a.t2d, b.t2d)
    assert b.config.aux_layer_ids == [2, 4, 6] and b.config.rope_parameters == a.config.rope_parameters
    assert b.config.target_model == str(target)
    assert result.engines == (("vllm", "sglang", "trtllm") if fmt == "eagle3" else ("vllm",))


def test_bf16_export_is_checked_against_rounded_weights(tmp_path, target):
    ckpt = saved(tmp_path, make_draft(1, target))
    export(ckpt, "eagle3", tmp_path / "out")  # verify_export passed inside
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert tensors["fc.weight"].dtype == torch.bfloat16 and tensors["d2t"].dtype == torch.int64
    assert tensors["t2d"].dtype == torch.bool and "embed_tokens.weight" not in tensors
    source = load_draft(ckpt)
    assert torch.equal(tensors["fc.weight"], source.fc.weight.to(torch.bfloat16))


def test_run_directory_and_included_embeddings(tmp_path, target):
    run = tmp_path / "run"
    save_draft(make_draft(2, target), run / "train" / "checkpoint-final", dtype=torch.float32)
    export(run, "eagle3", tmp_path / "out", include_embeddings=True)
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert tensors["embed_tokens.weight"].shape == (97, 32)


def test_a_wrong_config_fails_the_export_loudly(tmp_path, target, monkeypatch):
    ckpt = saved(tmp_path, make_draft(3, target))
    real = export_mod.config_json

    def wrong_theta(*args):
        config = real(*args)
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 20000.0}
        return config

    monkeypatch.setattr(export_mod, "config_json", wrong_theta)
    with pytest.raises(ExportError, match="re-read rope_parameters"):
        export(ckpt, "eagle3", tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out").exists()


def test_engine_refusals_name_the_engine_and_reason(tmp_path, target):
    ckpt = saved(tmp_path, make_draft(4, target, aux=(1, 3, 5, 6)))
    with pytest.raises(ExportError) as err:
        export(ckpt, "eagle3", tmp_path / "out")
    assert "SGLang: aux_layer_ids [1, 3, 5, 6] start at 1" in str(err.value) and "PR #25454" in str(err.value)
    assert "vLLM" not in str(err.value) and "TensorRT-LLM" not in str(err.value)
    result = export(ckpt, "eagle3", tmp_path / "out", engines=["vllm", "trtllm"])  # both take 4 aux states
    assert result.engines == ("vllm", "trtllm")
    assert any("4 aux states: needs a vLLM" in n for n in result.notes)
    assert any("eagle3_layers_to_capture: [0, 2, 4, 5]" in n for n in result.notes)
    with pytest.raises(ExportError, match="do not load the speculators format"):
        export(ckpt, "speculators", tmp_path / "out2", engines=["sglang"])


@pytest.mark.parametrize(
    "options,refused,needs",
    [
        (
            {"norm_before_residual": True},
            ["SGLang: norm_before_residual", "TensorRT-LLM: norm_before_residual"],
            [],
        ),
        (
            {"norm_output": True},
            ["SGLang: norm_output", "TensorRT-LLM: norm_output"],
            [],
        ),
        (
            {"num_layers": 2},
            ["TensorRT-LLM: num_layers 2"],
            ["needs vLLM with PR #26164", "needs SGLang with PR #24663"],
        ),
        ({"norm_before_fc": True}, [], ["needs vLLM with PR #36545", "needs SGLang with PR #32334"]),
        (
            {"sliding_window": 16},
            ["SGLang: sliding_window 16", "TensorRT-LLM: sliding_window 16"],
            [],
        ),
        (
            {"aux": (4, 6, 8)},
            ["SGLang: aux layer id 8 (the last layer's output)"],
            ["needs vLLM with PR #36063"],
        ),
    ],
)
def test_option_refusals_and_versions(tmp_path, target, options, refused, needs):
    """Each option: the engines that cannot run it refuse it by name; the others note the version needed
    (the tiny target is a Llama: SGLang captures the last layer's output only for gpt-oss)."""
    ckpt = saved(tmp_path, make_draft(15, target, **options))
    if refused:
        with pytest.raises(ExportError) as err:
            export(ckpt, "eagle3", tmp_path / "all")
        for r in refused:
            assert r in str(err.value)
    fine = [
        e
        for e in ("vllm", "sglang", "trtllm")
        if not any(
            r.startswith({"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}[e]) for r in refused
        )
    ]
    result = export(ckpt, "eagle3", tmp_path / "out", engines=fine, dtype="float32")
    for n in needs:
        assert any(n in note for note in result.notes), (n, result.notes)
    reread = import_draft(tmp_path / "out", tmp_path / "back", target=str(target))
    assert same_outputs(load_draft(ckpt), load_draft(reread))
    assert load_draft(reread).config == load_draft(ckpt).config  # every option read back, the window too
    spec = export(ckpt, "speculators", tmp_path / "spec")  # vLLM serves every option
    assert "embed_tokens.weight" in load_file(str(spec.path / "model.safetensors"))  # carried by default


@pytest.mark.parametrize(
    "aux,message",
    [
        ((4, 2, 6), "not strictly increasing"),
        ((0, 2, 6), "id 0"),
        ((2, 4, 9), "out of range for a target with 8 layers"),
    ],
)
def test_aux_layer_ids_checked(tmp_path, target, aux, message):
    ckpt = saved(tmp_path, make_draft(5, target, aux=aux))
    with pytest.raises(ExportError, match=message):
        export(ckpt, "eagle3", tmp_path / "out")


def test_dynamic_rope_refused(tmp_path, target):
    ckpt = saved(
        tmp_path, make_draft(6, target, rope={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    )
    with pytest.raises(ExportError, match="rope_type 'dynamic'"):
        export(ckpt, "eagle3", tmp_path / "out")


def test_embedding_must_be_the_targets(tmp_path, target):
    draft = make_draft(7, target)
    with torch.no_grad():
        draft.embed_tokens.weight[3] += 1.0
    with pytest.raises(ExportError, match="embed_tokens differs from the embedding of target"):
        export(saved(tmp_path, draft), "eagle3", tmp_path / "out")


def test_speculators_config_and_names(tmp_path, target):
    ckpt = saved(tmp_path, make_draft(8, target, rope=YARN))
    export(ckpt, "speculators", tmp_path / "out", num_speculative_tokens=4)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    method = config["speculators_config"]["proposal_methods"][0]
    assert method == {
        "proposal_type": "greedy",
        "speculative_tokens": 4,
        "verifier_accept_k": 1,
        "accept_tolerance": 0.0,
    }
    assert config["speculators_config"]["verifier"] == {
        "name_or_path": str(target),
        "architectures": ["LlamaForCausalLM"],
    }
    names = set(load_file(str(tmp_path / "out" / "model.safetensors")))
    assert "layers.0.self_attn.q_proj.weight" in names and not any(n.startswith("midlayer.") for n in names)


def test_cli(tmp_path, target, capsys):
    ckpt = saved(tmp_path, make_draft(9, target))
    assert main_export([str(ckpt), "--format", "eagle3", "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    assert (
        main(["export", str(tmp_path / "nowhere"), "--format", "eagle3", "--out", str(tmp_path / "x")]) == 2
    )
    assert "neither an eyas checkpoint" in capsys.readouterr().err
    # an existing directory with foreign files is never replaced
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main(["export", str(ckpt), "--format", "eagle3", "--out", str(tmp_path / "busy")]) == 2
    assert "refusing to replace" in capsys.readouterr().err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_peagle_round_trip_keeps_its_mask_slots(tmp_path, target, fmt):
    """A P-EAGLE draft exported and imported back: the kind and mask token survive, mask_hidden is written
    as vLLM reads it (eagle3: (1, W) beside mask_token_id / pard_token; speculators `peagle`: (1, 1, W), as
    speculators' PEagleDraftModel holds it), and the re-read draft's logits equal the original's, its mask
    slots included (the export's own check runs them: a changed mask_hidden changes those logits)."""
    draft = make_draft(0, target, kind="peagle", mask_token_id=7)
    export(saved(tmp_path, draft), fmt, tmp_path / "out", dtype="float32", num_speculative_tokens=5)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    width = draft.config.fc_in_features
    if fmt == "eagle3":
        assert (config["mask_token_id"], config["pard_token"]) == (7, 7)
        assert tuple(tensors["mask_hidden"].shape) == (1, width)
    else:
        assert (config["speculators_model_type"], config["mask_token_id"]) == ("peagle", 7)
        assert config["speculators_config"]["algorithm"] == "peagle"
        assert tuple(tensors["mask_hidden"].shape) == (1, 1, width)
    back = load_draft(import_draft(tmp_path / "out", tmp_path / "back", target=str(target)))
    assert (back.config.kind, back.config.mask_token_id) == ("peagle", 7)
    assert same_outputs(draft, back)
    with torch.no_grad():
        back.mask_hidden.weight.add_(0.5)
    assert not same_outputs(draft, back)


def test_a_trained_embedding_is_the_drafts_own_wherever_it_runs(tmp_path, target):
    """A published P-EAGLE draft whose embed_tokens differs from the target's (speculators 0.9.0's P-EAGLE
    trains it: embed_requires_grad) is imported as the draft's own embedding (own_embedding): loading it
    with the target's embedding at hand (the loop, score_drafts) keeps the file's table, its mask slots
    read the trained mask row, and the eagle3 export ships the table (vLLM then keeps it), refused for SGLang.
    A published draft that ships the target's own table is not marked."""
    draft = make_draft(0, target, kind="peagle", mask_token_id=7)
    export(saved(tmp_path, draft), "speculators", tmp_path / "same", dtype="float32")
    plain = load_draft(import_draft(tmp_path / "same", tmp_path / "plain", target=str(target)))
    assert plain.config.own_embedding is False
    tensors = load_file(str(tmp_path / "same" / "model.safetensors"))
    tensors["embed_tokens.weight"][7] += 0.25  # the mask row, trained
    src = tmp_path / "trained"
    src.mkdir()
    (src / "config.json").write_text((tmp_path / "same" / "config.json").read_text())
    save_file(tensors, str(src / "model.safetensors"))
    ckpt = import_draft(src, tmp_path / "own", target=str(target))
    target_embed = plain.embed_tokens.weight.detach()
    back = load_draft(ckpt, embed=target_embed)
    assert back.config.own_embedding is True
    assert torch.equal(back.embed_tokens.weight, tensors["embed_tokens.weight"])
    assert not same_outputs(draft, back)  # its mask slots read the trained row
    export(ckpt, "eagle3", tmp_path / "vllm", dtype="float32")
    assert torch.equal(
        load_file(str(tmp_path / "vllm" / "model.safetensors"))["embed_tokens.weight"],
        tensors["embed_tokens.weight"],
    )
    with pytest.raises(ExportError, match="own_embedding"):
        export(ckpt, "eagle3", tmp_path / "sglang", dtype="float32", engines=["sglang"])


def test_only_the_rounds_a_draft_trained_are_exported(tmp_path, target):
    """A checkpoint records the rounds of k drafts it trained (DraftConfig.trained_k: 1 .. train.ttt_steps): a
    P-EAGLE draft of 3 depths exports at k <= 3 and is refused at 4, naming the flag and what to serve; an
    EAGLE-3 head (a chain reuses it) exports past its TTT steps; a P-EAGLE draft with no record (imported
    from another trainer) exports at any k. Nothing is written for a refused export."""
    trained = saved(
        tmp_path, make_draft(0, target, kind="peagle", mask_token_id=7, trained_k=[1, 2, 3]), "pe"
    )
    export(trained, "eagle3", tmp_path / "k3", dtype="float32", num_speculative_tokens=3)
    with pytest.raises(ExportError) as e:
        export(trained, "eagle3", tmp_path / "k4", dtype="float32", num_speculative_tokens=4)
    assert str(e.value) == (
        "--num-speculative-tokens k=4: this P-EAGLE draft trained 3 depths (train.ttt_steps=3); a depth past "
        "them is untrained: serve k <= 3"
    )
    assert not (tmp_path / "k4").exists()
    eagle = saved(tmp_path, make_draft(0, target, trained_k=[1, 2, 3]), "e3")
    export(eagle, "eagle3", tmp_path / "e3k5", dtype="float32", num_speculative_tokens=5)
    unknown = saved(tmp_path, make_draft(0, target, kind="peagle", mask_token_id=7), "unknown")
    export(unknown, "eagle3", tmp_path / "k8", dtype="float32", num_speculative_tokens=8)
