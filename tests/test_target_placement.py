"""The target placed across devices (`target.device_map`): on this CPU machine half of the decoder
layers and the lm_head are offloaded to disk (accelerate's hooks load them for each forward),
which is the code path of a target split over GPUs. Capture and regeneration must not change."""

import data_fixtures
import pytest
import torch
from data_fixtures import assert_capture_exact, one_thread  # noqa: F401  (one_thread: fixture)
from test_data_capture import IDS, N_LAYERS, fresh_run, recipe, regen_run, shard_tensors  # noqa: F401

from eyas.data.capture import run_capture
from eyas.data.regenerate import read_sequences, run_regenerate
from eyas.data.target import load_target
from eyas.recipes.load import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


def split_map() -> dict[str, str]:
    """Even layers in RAM, odd layers and the lm_head on disk."""
    return data_fixtures.split_map(N_LAYERS)


def test_split_placement_captures_hidden_states_exactly(regen_run, tmp_path, capsys):
    target, run = regen_run
    ref_model, _ = load_target(str(target), "float32", "cpu")
    model, _ = load_target(
        str(target), "float32", device_map=split_map(), offload_folder=str(tmp_path / "off")
    )
    said = capsys.readouterr().out
    assert (
        "target: device_map=explicit: layer 0 on cpu, layer 1 on disk, layer 2 on cpu, layer 3 on disk, "
        "layer 4 on cpu, layer 5 on disk; lm_head on disk"
    ) in said
    assert model.model.layers[1].mlp.router.weight.device.type == "meta"  # really offloaded
    assert_capture_exact(
        model, ref_model, [s["input_ids"] for s in read_sequences(run)[:3]], IDS, 64, "split"
    )


@pytest.mark.parametrize("teacher", ["final", "topk"])
def test_capture_stage_with_offloaded_layers_equals_one_device(regen_run, tmp_path, teacher):
    """The whole stage, the top-k teacher included (its lm_head weight is on disk, read from the
    checkpoint)."""
    target = regen_run[0]
    one, split = fresh_run(regen_run, tmp_path, "one"), fresh_run(regen_run, tmp_path, "split")
    keys = {"teacher": teacher, "teacher_topk": 8} if teacher == "topk" else {}
    run_capture(recipe(target, **keys), one, progress=False)
    r = recipe(target, **keys)
    r.target.device, r.target.device_map, r.target.offload_folder = "auto", split_map(), str(tmp_path / "off")
    run_capture(r, split, progress=False)
    (i1, s1), (i2, s2) = shard_tensors(one), shard_tensors(split)
    assert i1["num_tokens"] == i2["num_tokens"] > 0 and len(s1) == len(s2)
    for a, b in zip(s1, s2):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "shards differ"


def test_planned_placement_offloads_and_regenerates_the_same_tokens(regen_run, tmp_path, capsys):
    """device_map: sequential with a RAM budget smaller than the model: accelerate plans the split
    (the rest on disk) and greedy regeneration (HF generate) gives the same token ids."""
    target, run = regen_run
    base = {"model": str(target), "dtype": "float32"}
    data = {"prompts": str(run.parent / "prompts.jsonl"), "num_eval_prompts": 2, "max_new_tokens": 12}
    planned = load_recipe(
        {
            "target": {
                **base,
                "device_map": "sequential",
                "max_memory": {"cpu": "800KB"},
                "offload_folder": str(tmp_path / "off"),
            },
            "data": data,
        }
    )
    split = fresh_run(regen_run, tmp_path, "split")
    (split / "regenerate").rename(split / "regenerate.one")  # regenerate again, with the planned placement
    run_regenerate(planned, split, progress=False)
    said = capsys.readouterr().out
    assert "target: device_map=sequential: layers 0-1 on cpu, layers 2-5 on disk; lm_head on disk" in said
    assert [s["input_ids"] for s in read_sequences(split)] == [s["input_ids"] for s in read_sequences(run)]


def make_mxfp4_target(path):
    """A tiny gpt-oss checkpoint stored as gpt-oss-120b is: MoE expert weights as MXFP4 blocks (E, rows,
    cols/32, 16) uint8, two e2m1 values per byte, with e8m0 scales (E, rows, cols/32), and a
    quantization_config naming the unquantized modules."""
    import json

    from data_fixtures import make_tiny_target
    from safetensors.torch import load_file, save_file

    path = make_tiny_target(path, num_layers=2)
    cfg = json.loads((path / "config.json").read_text())
    E, H, I = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    g = torch.Generator().manual_seed(0)
    stored = {}
    for f in list(path.glob("*.safetensors")):
        for k, v in load_file(f).items():
            if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
                rows, cols = (2 * I, H) if k.endswith("gate_up_proj") else (H, I)
                stored[k + "_blocks"] = torch.randint(
                    0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.uint8
                )
                stored[k + "_scales"] = torch.randint(
                    120, 125, (E, rows, cols // 32), generator=g, dtype=torch.uint8
                )
            else:
                stored[k] = v
        f.unlink()
    save_file(stored, path / "model.safetensors", metadata={"format": "pt"})
    from eyas.data.gpt_oss import GPT_OSS_SHARED

    cfg["quantization_config"] = GPT_OSS_SHARED["quantization_config"]  # the hub checkpoint's
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_mxfp4_checkpoint_is_dequantized_where_its_kernels_cannot_run_and_says_so(tmp_path, capsys):
    path = make_mxfp4_target(tmp_path / "mxfp4")
    auto, _ = load_target(str(path), "float32", "cpu")
    assert (
        "target: MXFP4 weights dequantized to float32 (MXFP4 kernels unavailable here)"
        in capsys.readouterr().out
    )
    asked, _ = load_target(str(path), "float32", "cpu", weights="dequantized")
    assert "target: MXFP4 weights dequantized to float32 (as target.weights asks)" in capsys.readouterr().out
    experts = auto.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dtype == torch.float32 and experts.gate_up_proj.shape == (4, 64, 128)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.equal(auto(input_ids=ids).logits, asked(input_ids=ids).logits)
    with pytest.raises(
        RuntimeError,
        match=r"target.weights=mxfp4: transformers dequantized the MXFP4 weights, "
        r"because its MXFP4 kernels cannot run here",
    ):
        load_target(str(path), "float32", "cpu", weights="mxfp4")


def test_weights_key_on_a_checkpoint_without_mxfp4_names_the_key(regen_run):
    with pytest.raises(
        ValueError,
        match=r"target.weights=dequantized: .* does not store MXFP4 weights; leave "
        r"target.weights at auto",
    ):
        load_target(str(regen_run[0]), "float32", "cpu", weights="dequantized")


@pytest.mark.parametrize("embed,lm_head", [("cpu", "disk"), ("disk", "cpu")])
def test_serving_loop_on_a_split_target_equals_one_device(regen_run, tmp_path, embed, lm_head):
    """The speculative loop (eyas eval, eyas serve) on a split target: the input embedding or the lm_head
    offloaded, odd layers on disk, so the loop's masks, its KV cache (rolled back and compacted after
    each verification) and the draft's aux states cross accelerate's hooks. Every request's tokens and
    every verification's accepted count equal the one-device loop's: with the real (random) draft
    greedy and sampled at T = 1 with seeds (where the draft's probabilities shape what is sampled), and
    with drafts rewritten to be right 60% of the time (every acceptance length), greedy and lossless."""
    from oracle import OracleEngine
    from tiny_targets import draft_for

    from eyas.data.target import input_device
    from eyas.recipes.types import TreeShape
    from eyas.serve.decoding.engine import Engine, Request
    from eyas.serve.decoding.reference import greedy_generate
    from eyas.serve.decoding.sampling import SamplingParams

    target, new = regen_run[0], 16
    one, _ = load_target(str(target), "float32", "cpu")
    split, _ = load_target(
        str(target),
        "float32",
        device_map=data_fixtures.split_map(N_LAYERS, embed, lm_head),
        offload_folder=str(tmp_path / "off"),
    )
    offloaded = split.get_input_embeddings() if embed == "disk" else split.get_output_embeddings()
    assert offloaded.weight.device.type == "meta" and input_device(split) == torch.device("cpu")
    draft = draft_for(one, seed=0, aux_ids=IDS)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, one.config.vocab_size, (int(n),), generator=g).tolist()
        for n in (5, 17, 9, 30, 2, 12)
    ]
    assert [greedy_generate(split, p, new)[0] for p in prompts] == [
        greedy_generate(one, p, new)[0] for p in prompts
    ]

    def decode(model, engine_cls=Engine, shape=None, temperature=0.0, **kw):
        reqs = [
            Request(p, SamplingParams(temperature=temperature, max_tokens=new, seed=i), id=f"r{i}")
            for i, p in enumerate(prompts)
        ]
        eng = engine_cls(model, *((draft, shape) if shape else ()), max_batch=4, **kw)  # 2 join as others end
        eng.run(reqs)
        eng.close()
        return [(r.tokens, r.accepted) for r in reqs]

    plain = decode(one)
    assert decode(split) == plain
    truth = {f"r{i}": p + t for i, (p, (t, _)) in enumerate(zip(prompts, plain))}
    for shape in (TreeShape.chain(3), TreeShape(2, 2, 4)):
        for temperature in (0.0, 1.0):
            assert decode(split, Engine, shape, temperature) == decode(one, Engine, shape, temperature), (
                f"{shape.label} T={temperature}: the split target decodes differently"
            )
        oracle = dict(truth=truth, p_wrong=0.4, seed=1)
        got = decode(split, OracleEngine, shape, **oracle)
        assert got == decode(one, OracleEngine, shape, **oracle), f"{shape.label}: the split target differs"
        assert [t for t, _ in got] == [t for t, _ in plain], f"{shape.label}: not lossless"
        assert {a for _, acc in got for a in acc} >= {0, 1, 2}  # rejections, partial and longer acceptances


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_bf16_arithmetic_computes_in_float32(regen_run, native, monkeypatch, capsys):
    """target.dtype bfloat16 and train.mixed_precision bf16 on a CPU without AVX512-BF16 / AMX (an AVX2
    core multiplies bf16 ~100x slower than float32): float32, said once per field; where the CPU has them,
    bf16 as asked. The vLLM server started on such a CPU gets float32 too (for bfloat16 and auto)."""
    from eyas.data import target as T
    from eyas.train.trainer import mixed_precision

    monkeypatch.setattr(T, "native_bf16_cpu", lambda: native)
    monkeypatch.setattr(T, "_SAID", set())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, on a GPU host too
    model, _ = load_target(str(regen_run[0]), "bfloat16", "cpu")
    load_target(str(regen_run[0]), "bfloat16", "cpu")
    assert next(model.parameters()).dtype == (torch.bfloat16 if native else torch.float32)
    assert T.server_dtype("bfloat16") == ("bfloat16" if native else "float32")
    # vLLM's auto casts a float32 checkpoint to bf16 on a CPU: float32 there too
    assert T.server_dtype("auto") == ("auto" if native else "float32")
    assert (
        T.server_dtype("float32") == "float32"
        and T.pick_dtype("float32", torch.device("cpu")) == torch.float32
    )
    assert mixed_precision("bf16") == ("bf16" if native else "no") and mixed_precision("auto") == "no"
    err = capsys.readouterr().err
    capability = torch.backends.cpu.get_cpu_capability()
    said = [
        line for line in err.splitlines() if line.startswith("[eyas] ") and "computing in float32" in line
    ]
    assert said == (
        []
        if native
        else [
            f"[eyas] the target in bfloat16: this CPU has no bf16 arithmetic (AVX512-BF16 / AMX; torch "
            f"reports {capability}), where bf16 runs ~100x slower than float32: computing in float32",
            f"[eyas] train.mixed_precision bf16: this CPU has no bf16 arithmetic (AVX512-BF16 / AMX; torch "
            f"reports {capability}), where bf16 runs ~100x slower than float32: computing in float32",
        ]
    )


def test_hf_backend_refuses_a_target_that_cannot_fit_before_loading_anything(tmp_path, capsys, monkeypatch):
    """gpt-oss-120b's own config (eyas's copy of the hub's, MXFP4 experts; no weights, nothing is loaded) with
    `data.backend: hf` on this CPU: transformers would dequantize its experts (its MXFP4 kernels do not run
    here) and hold 116.83B parameters in bf16, 233.7 GB (float32, 467.3 GB, on a CPU without bf16
    arithmetic), more than this machine has. One line names target.weights, both sizes and the fix. A host
    with that much memory is told it has 64 GB (os.sysconf's page count): the refusal is tested there too."""
    import os

    from data_fixtures import write_prompts
    from transformers import GptOssConfig

    from eyas.cli import main
    from eyas.data.gpt_oss import GPT_OSS_SHARED, KNOWN_TARGETS
    from eyas.data.target import native_bf16_cpu

    target = tmp_path / "gpt-oss-120b"
    GptOssConfig(**GPT_OSS_SHARED, **KNOWN_TARGETS["openai/gpt-oss-120b"]).save_pretrained(target)
    run = tmp_path / "run"
    over = [f"target.model={target}", "target.device_map=null", "target.device=cpu", "data.backend=hf"]
    over += [f"data.prompts={write_prompts(tmp_path / 'p.jsonl', 8)}", "data.num_eval_prompts=2"]
    assert main(["prompts", "gpt-oss-120b", "--out", str(run), *over]) == 0
    capsys.readouterr()
    dtype, size = ("bfloat16", 2) if native_bf16_cpu() else ("float32", 4)
    real = os.sysconf
    if real("SC_PAGE_SIZE") * real("SC_PHYS_PAGES") >= 116_829_156_672 * size:  # a host it would fit
        monkeypatch.setattr(
            os, "sysconf", lambda k: 64 * 10**9 // real("SC_PAGE_SIZE") if k == "SC_PHYS_PAGES" else real(k)
        )
    assert main(["regenerate", str(run), "--no-progress"]) == 2
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"eyas: error: target.weights: transformers would hold {target} as {dtype}, its MXFP4 experts "
        f"dequantized (transformers' MXFP4 kernels cannot run here): {116_829_156_672 * size / 1e9:.1f} GB, "
        f"and this machine's memory (the CPU) has {memory / 1e9:.1f} GB; set data.backend: vllm (vLLM's "
        "replicas, the vllm section; it runs MXFP4 weights as they are stored)"
    )
    assert not (run / "regenerate").exists() or not any((run / "regenerate").iterdir())  # nothing written
