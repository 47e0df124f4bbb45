"""gpt-oss-120b's widths end to end on the CPU: the built-in full-width target (`eyas-full-width`:
gpt-oss-120b's config but 4 layers and 4 experts, the experts stored in MXFP4 as the hub stores them,
random weights) through every stage with recipes/gpt-oss-120b.yaml's own draft (215.5M trainable, draft vocab
32,000, the target's lm_head rows frozen, TTT 5; one AdamW step of one micro-batch of 32 tokens), and the
figures `eyas plan` gives for gpt-oss-120b: its draft's parameter count and the bytes a captured token
takes. Online training and the export in vLLM at these widths: benchmarks/bench_full_width.py."""

import json
import subprocess
import sys

import pytest
from safetensors import safe_open

from eyas.data.demo_target.full_width import EXPERTS, LAYERS, ensure_full_width_target, run_overrides

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def full_width_run(tmp_path_factory):
    """`eyas run gpt-oss-120b` on the full-width target, every stage; regeneration and capture in vLLM where
    it runs MXFP4 here (AMX), else in transformers (full_width.run_overrides says which)."""
    run = tmp_path_factory.mktemp("full-width") / "run"
    # 2 prompts to train on (one batch to regenerate and capture) and 2 to evaluate: the stages' sizes, not
    # their data, are what the test reads
    over = [*run_overrides(), "data.num_prompts=4"]
    eyas(["run", "gpt-oss-120b", "--out", str(run), "--no-progress", *over])
    return run, over


def eyas(args: list[str]) -> None:
    """An `eyas` command in a process of its own: the memory it takes at these widths (~10 GB to train the
    draft, ~7 GB to export it) is given back when it ends, for the tests that run beside this one."""
    out = subprocess.run([sys.executable, "-m", "eyas", *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_target_is_gpt_oss_120b_but_for_its_depth_and_experts():
    from transformers import AutoConfig, GptOssConfig

    from eyas.data.gpt_oss import GPT_OSS_SHARED, HUB_CONFIG_REST, KNOWN_TARGETS

    path = ensure_full_width_target()
    ours = AutoConfig.from_pretrained(path).to_dict()
    hub = GptOssConfig(**GPT_OSS_SHARED, **HUB_CONFIG_REST, **KNOWN_TARGETS["openai/gpt-oss-120b"]).to_dict()
    differ = {k for k in hub.keys() | ours.keys() if hub.get(k) != ours.get(k)}
    assert differ <= {
        "num_hidden_layers",
        "num_local_experts",
        "layer_types",
        "_name_or_path",
        "transformers_version",
    }
    assert (ours["num_hidden_layers"], ours["num_local_experts"], ours["num_experts_per_tok"]) == (
        LAYERS,
        EXPERTS,
        4,
    )
    assert ours["layer_types"] == hub["layer_types"][:LAYERS]
    with safe_open(path / "model.safetensors", "pt") as f:
        names = set(f.keys())
        blocks = f.get_slice("model.layers.0.mlp.experts.gate_up_proj_blocks")
        scales = f.get_slice("model.layers.0.mlp.experts.down_proj_scales")
        assert (blocks.get_shape(), blocks.get_dtype()) == ([EXPERTS, 5760, 90, 16], "U8")  # 2I x H/32 x 16 B
        assert (scales.get_shape(), scales.get_dtype()) == ([EXPERTS, 2880, 90], "U8")  # H x I/32 e8m0
        assert f.get_slice("lm_head.weight").get_shape() == [201088, 2880]
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)  # no float copy


def test_every_stage_at_full_width(full_width_run, tmp_path):
    """Capture stores 23,045 bytes a token (3 aux states and the final one, bf16, the id and the mask: what
    `eyas plan` prices gpt-oss-120b's capture at); the draft trains with exactly the parameters `eyas plan`
    counts for recipes/gpt-oss-120b.yaml; eval reports; the eagle3 export that `eyas publish --dry-run` writes
    and checks holds the draft at those sizes."""
    from eyas.infra.layout import read_done
    from eyas.plan.command import plan
    from eyas.recipes.load import load_recipe

    run, over = full_width_run
    index = json.loads((run / "capture" / "index.json").read_text())
    with safe_open(run / "capture" / index["shards"][0]["file"], "pt") as f:
        per_token = [f.get_tensor(k) for k in f.keys() if k != "offsets"]  # offsets: one per sequence
    assert sum(t.nbytes for t in per_token) / index["num_tokens"] == 4 * 2880 * 2 + 5 == 23_045
    assert read_done(run, "capture")["bytes_per_token"] == pytest.approx(23_045, abs=1)
    p = plan(load_recipe("gpt-oss-120b"), "8xH100")
    assert p.capture_bytes_per_token == 23_045
    assert read_done(run, "train")["trainable_parameters"] == p.draft_trainable == 215_490_240
    report = json.loads((run / "report.json").read_text())
    assert report["lossless"] is True and report["results"][0]["k"] == 2  # bf16 partings only numerical
    folder = tmp_path / "publish"  # the dry run writes the eagle3 export as `eyas export` does, and checks it
    eyas(["publish", str(run), "--repo", "someone/full-width-draft", "--dry-run", "--out", str(folder)])
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["draft_vocab_size"], cfg["intermediate_size"]) == (2880, 32000, 17280)
