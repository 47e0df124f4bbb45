"""Any causal LM: the whole pipeline (prompts -> regenerate -> capture -> vocab -> train -> eval) on
random tiny Llama and Qwen3 targets (Qwen3's lm_head tied to its embedding), loaded with `from_pretrained`
exactly as gpt-oss-120b is; a Mistral target loaded and captured exactly (its weights are the Llama's: the
whole pipeline on it measured the Llama's tau to the last digit, so it runs only what reads the family).

Each target's residual branches are scaled (data_fixtures.LEARNABLE_SCALE: 0.02 Llama and Mistral, 0.1 Qwen3)
so that its answers can be learnt; unscaled, no draft learns a random target's (a trained one measured 1.02
at k = 3). The floor: tau >= 2.0 at k = 3 on the 16 held-out prompts. Measured (2-core AMD EPYC, AVX512-BF16,
one thread): trained (LEARNABLE_TRAINING: 100 steps) Llama 3.088, Mistral 3.088 (its weights are Llama's:
same seed and shapes, no sliding window), Qwen3 3.069 (the same three on the AVX2-only EPYC); untrained
(train.max_steps=1, lr 1e-12) 1.019, 1.019, 1.091."""

import json

import pytest
import torch
from data_fixtures import (  # noqa: F401
    LEARNABLE_SCALE,
    LEARNABLE_TRAINING,
    assert_capture_exact,
    make_family_target,
    one_thread,
    tiny_recipe,
    write_prompts,
)

from eyas.data.regenerate import read_sequences
from eyas.data.target import load_head_weights, load_target
from eyas.infra import layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

FLOOR = 2.0


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_pipeline_end_to_end(family, tmp_path):
    target = make_family_target(tmp_path / family, family, branch_scale=LEARNABLE_SCALE[family])
    prompts = write_prompts(tmp_path / "prompts.jsonl", 112, seed=1)
    run = tmp_path / "run"
    run_all(load_recipe(tiny_recipe(target, prompts, **LEARNABLE_TRAINING)), run, progress=False)
    report = json.loads((run / "report.json").read_text())
    assert report["lossless"] is True
    assert report["num_prompts"] == 16 and report["k"] == 3
    print(f"{family}: tau {report['acceptance_length']:.3f}")
    assert report["acceptance_length"] >= FLOOR, report  # trained 3.07-3.09, untrained 1.02-1.09
    assert report["acceptance_length"] == pytest.approx(1 + sum(report["per_position_acceptance"]), abs=1e-9)
    model, _ = load_target(str(target), "float32", "cpu")
    ids = layout.read_done(run, "capture")["aux_layer_ids"]
    assert_capture_exact(model, model, [s["input_ids"] for s in read_sequences(run)[:3]], ids, 64, family)
    heads = load_head_weights(str(target))
    assert torch.equal(heads["lm_head"], model.lm_head.weight)
    if family == "qwen3":  # tied: one tensor in the checkpoint serves both
        assert torch.equal(heads["lm_head"], heads["embed"])


def test_a_mistral_target_loads_and_captures_exactly(tmp_path):
    """MistralForCausalLM through load_target, its aux states, final state and logits captured exactly (one
    right-padded batch of three lengths), its lm_head read from the checkpoint as loaded."""
    family = "mistral"
    target = make_family_target(tmp_path / family, family, branch_scale=LEARNABLE_SCALE[family])
    model, _ = load_target(str(target), "float32", "cpu")
    assert type(model).__name__ == "MistralForCausalLM"
    g = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (37, 20, 9)]
    assert_capture_exact(model, model, sequences, [1, 2, 3], 64, family)  # vLLM ids: inputs of layers 1-3
    assert torch.equal(load_head_weights(str(target))["lm_head"], model.lm_head.weight)
