"""Checkpoint round trip: save, load, identical logits; the files are the EAGLE-3 layout."""

import json

import pytest
import torch
from safetensors import safe_open

from eyas.train.checkpoint import load_draft, save_draft
from eyas.train.kinds.config import DraftConfig
from eyas.train.model import Eagle3Draft, KVCache


def random_draft(seed=0):
    torch.manual_seed(seed)
    cfg = DraftConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        vocab_size=101,
        draft_vocab_size=50,
        aux_layer_ids=[1, 3, 5],
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        max_position_embeddings=131072,
        target_model="some/target",
    )
    d = Eagle3Draft(cfg)
    d.embed_tokens.weight.data.normal_()
    d2t = torch.arange(50) * 2 - torch.arange(50)
    t2d = torch.zeros(101, dtype=torch.bool)
    t2d[torch.arange(50) * 2] = True
    d.set_vocab_map(d2t, t2d)
    return d.eval()


def logits_of(d):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 101, (1, 9), generator=g)
    aux = torch.randn(1, 9, 96, generator=g)
    with torch.no_grad():
        h, logits = d.step(ids, d.fuse(aux), torch.arange(9)[None], KVCache())
    return logits


def test_round_trip_identical_logits(tmp_path):
    d = random_draft()
    save_draft(d, tmp_path / "ckpt", dtype=torch.float32)
    back = load_draft(tmp_path / "ckpt")
    assert torch.equal(logits_of(d), logits_of(back))
    assert torch.equal(back.d2t, d.d2t) and back.d2t.dtype == torch.int64
    assert torch.equal(back.t2d, d.t2d) and back.t2d.dtype == torch.bool
    assert back.config == d.config


def test_layout_and_config(tmp_path):
    d = random_draft()
    save_draft(d, tmp_path / "ckpt", dtype=torch.bfloat16)
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert (cfg["vocab_size"], cfg["draft_vocab_size"]) == (101, 50)
    assert cfg["rope_scaling"]["rope_type"] == "yarn" and cfg["rope_theta"] == 150000.0
    with safe_open(tmp_path / "ckpt" / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert f.get_tensor("fc.weight").shape == (32, 96)
    assert keys == {
        "embed_tokens.weight",
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "midlayer.input_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.post_attention_layernorm.weight",
        "midlayer.self_attn.q_proj.weight",
        "midlayer.self_attn.k_proj.weight",
        "midlayer.self_attn.v_proj.weight",
        "midlayer.self_attn.o_proj.weight",
        "midlayer.mlp.gate_proj.weight",
        "midlayer.mlp.up_proj.weight",
        "midlayer.mlp.down_proj.weight",
    }


def test_overwrite_is_atomic(tmp_path, monkeypatch):
    """A failing save leaves the previous checkpoint intact and no temporary directory behind."""
    d = random_draft()
    save_draft(d, tmp_path / "ckpt", dtype=torch.float32)
    import eyas.train.checkpoint as ck

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "save_file", boom)
    with pytest.raises(OSError):
        save_draft(random_draft(1), tmp_path / "ckpt", dtype=torch.float32)
    assert torch.equal(logits_of(load_draft(tmp_path / "ckpt")), logits_of(d))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_loaded_beside_a_target_its_embedding_is_the_targets_own_tensor(tmp_path, dtype):
    """load_draft_beside: the draft in the target's dtype (float32 beside a float16 target) with the target's
    input embedding as its own (the same storage where the dtypes agree: no second vocab x H copy, 1.16 GB at
    gpt-oss-120b's widths in bf16), and the logits of the draft the file holds."""
    from eyas.train.checkpoint import load_draft_beside

    d = random_draft()
    save_draft(d, tmp_path / "ckpt", dtype=torch.float32)

    class Target(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(101, 32).to(dtype)
            self.embed.weight.data.copy_(d.embed_tokens.weight)

        def get_input_embeddings(self):
            return self.embed

    target = Target()
    back = load_draft_beside(tmp_path / "ckpt", target)
    want = torch.float32 if dtype == torch.float16 else dtype
    assert {p.dtype for p in back.parameters()} == {want} and not back.training
    shares = back.embed_tokens.weight.data_ptr() == target.embed.weight.data_ptr()
    assert shares == (dtype != torch.float16)
    assert torch.equal(logits_of(back), logits_of(load_draft(tmp_path / "ckpt", dtype=want)))
