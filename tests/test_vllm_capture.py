"""`capture.backend: vllm`: the demo target's hidden states from the real vLLM's forward
(extract_hidden_states + eyas's CPU hidden-states connector) equal the HF capture's, and a vLLM
worker killed mid-capture loses nothing: the re-run resumes after the last listed shard and ends
with the same shards as an uninterrupted capture.

Tolerance: both run fp32; vLLM's CPU kernels (fused MoE, its attention) round differently from
HF's eager ones. Measured on the demo target: max |diff| / max |value| 3.5e-7 over the aux states
and 6.3e-7 for the final state; the bound is 1e-5.
"""

import os
import shutil
import signal

import pytest
import torch
from data_fixtures import DEMO_SMALL
from safetensors.torch import load_file

from eyas.data.capture import run_capture
from eyas.data.capture_vllm import VllmCapture, VllmCaptureError
from eyas.data.prompts import run_prompts
from eyas.data.regenerate import run_regenerate
from eyas.io import read_json
from eyas.layout import read_done
from eyas.recipes.load import load_recipe

BASE = DEMO_SMALL + [
    "data.batch_size=4",  # the later value wins
    "capture.dtype=float32",
    "capture.batch_size=2",
    "capture.shard_tokens=200",
]
REL = 1e-5


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-capture")
    run_prompts(load_recipe("demo", BASE), root / "run", progress=False)
    run_regenerate(load_recipe("demo", BASE), root / "run", progress=False)
    hf = root / "hf"
    shutil.copytree(root / "run", hf)
    run_capture(load_recipe("demo", BASE), hf, progress=False)
    return root


def shards(run):
    index = read_json(run / "capture" / "index.json")
    return index, [load_file(str(run / "capture" / s["file"])) for s in index["shards"]]


def assert_close(run, hf):
    (i1, got), (i2, ref) = shards(run), shards(hf)
    assert [s["num_sequences"] for s in i1["shards"]] == [s["num_sequences"] for s in i2["shards"]]
    worst = {}
    for a, b in zip(got, ref):
        assert a.keys() == b.keys()
        for k in a:
            if a[k].is_floating_point():
                rel = ((a[k] - b[k]).abs().max() / b[k].abs().max()).item()
                worst[k] = max(worst.get(k, 0.0), rel)
                assert rel <= REL, (k, rel)
            else:
                assert torch.equal(a[k], b[k]), k
    return worst


def test_vllm_capture_equals_hf_and_resumes_after_the_worker_dies(vllm_python, regenerated, monkeypatch):
    run = regenerated / "vllm"
    shutil.copytree(regenerated / "run", run)
    recipe = load_recipe("demo", BASE + ["capture.backend=vllm"])
    calls = []
    capture = VllmCapture.capture

    def dies_on_the_third_batch(self, sequences):
        calls.append(len(sequences))
        if len(calls) == 3:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return capture(self, sequences)

    monkeypatch.setattr(VllmCapture, "capture", dies_on_the_third_batch)
    with pytest.raises(
        VllmCaptureError, match="the vLLM worker exited while capturing .*re-run the stage to resume"
    ):
        run_capture(recipe, run, progress=False)
    kept = read_json(run / "capture" / "index.json")["shards"]
    assert 1 <= len(kept) and sum(s["num_sequences"] for s in kept) <= 4
    monkeypatch.undo()
    stats = run_capture(recipe, run, progress=False)
    assert stats["num_sequences"] == 8
    worst = assert_close(run, regenerated / "hf")
    hf_rate = read_done(regenerated / "hf", "capture")["tokens_per_s"]
    print(f"capture max rel diff {worst}; tokens/s HF {hf_rate:.0f}, vLLM {stats['tokens_per_s']:.0f}")


def test_a_target_vllm_cannot_run_fails_with_vllms_own_message(vllm_python, tmp_path, capsys):
    """A tiny gpt-oss with head_dim 16, which transformers runs and vLLM's CPU attention does not."""
    from data_fixtures import make_tiny_target, tiny_recipe, write_prompts

    from eyas.cli import main
    from eyas.pipeline import run_all

    target = make_tiny_target(tmp_path / "target", num_layers=4)
    raw = tiny_recipe(target, write_prompts(tmp_path / "p.jsonl", 8), capture={"backend": "vllm"})
    run_all(load_recipe(raw), tmp_path / "run", stages=("prompts", "regenerate"), progress=False)
    assert main(["capture", str(tmp_path / "run"), "--no-progress"]) == 1
    line = [x for x in capsys.readouterr().err.splitlines() if x.strip()][-1]
    assert line.startswith(f"eyas: error: capture.backend: vllm: vLLM refused {target}: RuntimeError: "), line
    assert "Unsupported CPU attention configuration: head_dim=16" in line and "vllm.log" in line, line
    assert not list((tmp_path / "run" / "capture").glob("shard-*")), "nothing stored"
