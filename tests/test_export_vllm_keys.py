"""A gpt-oss-120b draft's export matches what vLLM's EAGLE-3 loader expects — names, shapes, dtypes
and config — computed on the meta device (nothing of its ~1.2 B parameters is allocated).

Expectations are transcribed from vllm/model_executor/models/llama_eagle3.py
(Eagle3LlamaForCausalLM.load_weights, LlamaModel.load_weights) and
vllm/transformers_utils/configs/speculators/{base,algos}.py.
"""

import pytest
import torch

from eyas.serve.interchange.formats import describe_export_keys
from eyas.train.kinds import kind_of
from eyas.train.kinds.config import DraftConfig
from eyas.train.kinds.config_json import eagle3_config, speculators_config

BF16, I64, BOOL = torch.bfloat16, torch.int64, torch.bool
H, V, VD = 2880, 201088, 32000

GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}

EXPECTED_EAGLE3 = {
    "fc.weight": ((H, 3 * H), BF16),
    "midlayer.input_layernorm.weight": ((H,), BF16),
    "midlayer.hidden_norm.weight": ((H,), BF16),
    "midlayer.self_attn.q_proj.weight": ((64 * 64, 2 * H), BF16),
    "midlayer.self_attn.k_proj.weight": ((8 * 64, 2 * H), BF16),
    "midlayer.self_attn.v_proj.weight": ((8 * 64, 2 * H), BF16),
    "midlayer.self_attn.o_proj.weight": ((H, 64 * 64), BF16),
    "midlayer.post_attention_layernorm.weight": ((H,), BF16),
    "midlayer.mlp.gate_proj.weight": ((17280, H), BF16),
    "midlayer.mlp.up_proj.weight": ((17280, H), BF16),
    "midlayer.mlp.down_proj.weight": ((H, 17280), BF16),
    "norm.weight": ((H,), BF16),
    "lm_head.weight": ((VD, H), BF16),
    "d2t": ((VD,), I64),
    "t2d": ((V,), BOOL),
}

# vLLM module parameters after load_weights' renaming and q/k/v, gate/up stacking
EXPECTED_VLLM_PARAMS = {
    "model.fc.weight": (H, 3 * H),
    "model.layers.0.input_layernorm.weight": (H,),
    "model.layers.0.hidden_norm.weight": (H,),
    "model.layers.0.self_attn.qkv_proj.weight": (64 * 64 + 2 * 8 * 64, 2 * H),
    "model.layers.0.self_attn.o_proj.weight": (H, 64 * 64),
    "model.layers.0.post_attention_layernorm.weight": (H,),
    "model.layers.0.mlp.gate_up_proj.weight": (2 * 17280, H),
    "model.layers.0.mlp.down_proj.weight": (H, 17280),
    "model.norm.weight": (H,),
    "lm_head.weight": (VD, H),
    "draft_id_to_target_id": (VD,),
}


@pytest.fixture
def cfg():
    return DraftConfig(
        hidden_size=H,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=17280,
        vocab_size=V,
        draft_vocab_size=VD,
        aux_layer_ids=[2, 18, 33],
        target_hidden_size=H,
        max_position_embeddings=131072,
        rope_parameters=GPT_OSS_ROPE,
        target_model="openai/gpt-oss-120b",
    )


def vllm_load_names(keys: dict) -> dict:
    """Published name -> (vLLM parameter, shard), as Eagle3LlamaForCausalLM.load_weights and
    LlamaModel.load_weights rename them; t2d is skipped there."""
    stacked = [
        (".q_proj", ".qkv_proj", "q"),
        (".k_proj", ".qkv_proj", "k"),
        (".v_proj", ".qkv_proj", "v"),
        (".gate_proj", ".gate_up_proj", 0),
        (".up_proj", ".gate_up_proj", 1),
    ]
    out = {}
    for name in keys:
        if "t2d" in name:
            continue
        if "d2t" in name:
            out[name] = ("draft_id_to_target_id", None)
            continue
        param = name if "lm_head" in name else "model." + name
        param = param.replace("midlayer.", "layers.0.")
        shard = None
        for old, new, shard_id in stacked:
            if old in param:
                param, shard = param.replace(old, new), shard_id
                break
        out[name] = (param, shard)
    return out


def stacked_shapes(keys: dict) -> dict:
    shapes = {}
    for name, (param, shard) in vllm_load_names(keys).items():
        shape = keys[name][0]
        if shard is None:
            shapes[param] = shape
        else:
            rows = shapes.get(param, (0, shape[1]))[0] + shape[0]
            shapes[param] = (rows, shape[1])
    return shapes


def test_eagle3_keys_shapes_dtypes(cfg):
    keys = describe_export_keys(cfg, "eagle3", torch.bfloat16)
    assert keys == EXPECTED_EAGLE3
    assert stacked_shapes(keys) == EXPECTED_VLLM_PARAMS
    with_embed = describe_export_keys(cfg, "eagle3", torch.bfloat16, include_embeddings=True)
    assert with_embed["embed_tokens.weight"] == ((V, H), BF16)


def test_speculators_keys_load_into_the_same_params(cfg):
    keys = describe_export_keys(cfg, "speculators", torch.bfloat16)
    assert set(keys) == {k.replace("midlayer.", "layers.0.") for k in EXPECTED_EAGLE3}
    assert stacked_shapes(keys) == EXPECTED_VLLM_PARAMS


def test_eagle3_config_fields_vllm_reads(cfg):
    c = eagle3_config(cfg, torch.bfloat16, kind_of(cfg))
    assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["model_type"] == "llama"
    assert c["num_hidden_layers"] == 1 and c["hidden_act"] == "silu"
    assert (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (
        H,
        64,
        8,
        64,
    )
    assert c["intermediate_size"] == 17280
    assert (c["vocab_size"], c["draft_vocab_size"]) == (V, VD)
    # LlamaModel: fc_input_size = target_hidden_size * 3
    assert c["target_hidden_size"] * 3 == EXPECTED_EAGLE3["fc.weight"][0][1]
    assert c["eagle_aux_hidden_state_layer_ids"] == [2, 18, 33]  # gpu_model_runner, input of layer k
    # SGLang: a list starting at 1 is output-of-layer numbering (+1), on every release
    assert c["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 17, 32],
        "use_aux_hidden_state": True,
        "norm_before_fc": False,
    }
    assert c["norm_before_fc"] is False and c["num_aux_hidden_states"] == 3
    assert c["norm_before_residual"] is False and c["attention_bias"] is False and c["mlp_bias"] is False
    assert c["tie_word_embeddings"] is False and c["torch_dtype"] == "bfloat16"
    assert c["rope_parameters"] == GPT_OSS_ROPE and c["rope_theta"] == 150000.0
    assert c["rope_scaling"] == {k: v for k, v in GPT_OSS_ROPE.items() if k != "rope_theta"}
    assert c["max_position_embeddings"] == 131072


def test_speculators_config_as_vllm_converts_it(cfg):
    c = speculators_config(cfg, torch.bfloat16, 3, "openai/gpt-oss-120b", ["GptOssForCausalLM"], kind_of(cfg))
    # SpeculatorsConfig.validate_speculators_config
    assert c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert c["speculators_config"]["verifier"]["name_or_path"] == "openai/gpt-oss-120b"
    assert c["speculators_model_type"] == "eagle3" and isinstance(c["transformer_layer_config"], dict)
    # extract_transformers_pre_trained_config + algos.update_eagle3
    pre = dict(c["transformer_layer_config"])
    pre["draft_vocab_size"] = c.get("draft_vocab_size")
    pre["target_hidden_size"] = c["target_hidden_size"]
    pre["norm_before_residual"] = c.get("norm_before_residual", True)
    pre["eagle_aux_hidden_state_layer_ids"] = c["eagle_aux_hidden_state_layer_ids"]
    assert pre["norm_before_residual"] is False  # vLLM's default would be True
    assert (pre["hidden_size"], pre["num_hidden_layers"], pre["vocab_size"]) == (H, 1, V)
    assert (pre["draft_vocab_size"], pre["target_hidden_size"]) == (VD, H)
    assert pre["eagle_aux_hidden_state_layer_ids"] == [2, 18, 33]
    assert pre["rope_parameters"] == GPT_OSS_ROPE
