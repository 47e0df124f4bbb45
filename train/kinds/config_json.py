"""The checkpoint format: config.json of the eagle3 (release) and speculators layouts, from a DraftConfig.
Torch-free, below train/ and serve/: the training checkpoint (train/checkpoint.py) and export
(serve/interchange/) write the same fields from here; the tensors' names and shapes are
serve/interchange/formats.py.

Aux-layer id conventions. eyas (and vLLM's top-level `eagle_aux_hidden_state_layer_ids`, and the
speculators library) number an aux state by the decoder layer whose INPUT it is: id k = HF
`hidden_states[k]`, and id N = the output of the last layer before the final norm (vLLM's
boundary numbering: the residual stream after k layers). ModelOpt (forward hooks on layer
outputs), SpecForge configs and TRT-LLM's `eagle3_layers_to_capture` name the OUTPUT of decoder
layer j = k - 1. SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` both ways: ids
starting at 1 as output numbering (it adds 1), others as boundaries (PR #25454; gpt-oss: PR #32334,
nvidia's v3 draft writes [24, 30, 36]). So the eagle3 config carries the top level `k` and an
`eagle_config` list SGLang reads as `k`: `k - 1` when the first id is 2 (which every SGLang release
reads right), else `k` (`sglang_layer_ids`), and the importer reads such a list back the same way.

Options (train/model.py): `norm_before_fc` is written at the top level (vLLM, speculators) and in
`eagle_config` (vLLM reads it there first since PR #42143; TRT-LLM only there); its weight is
`input_norm.weight`. `norm_before_residual` is top level. Later decoder layers are `layers.1.*`...
in both layouts (vLLM maps `midlayer.` to `layers.0.`); `num_hidden_layers` counts them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import DraftConfig

if TYPE_CHECKING:  # annotations only: this module stays torch-free
    import torch

    from .base import DraftKind

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"  # vLLM registry entry, SGLang EntryClass
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"  # speculators Eagle3SpeculatorConfig default


def output_numbering(layer_ids: list[int]) -> list[int]:
    """eyas/vLLM ids -> output-of-layer numbering (ModelOpt, TRT-LLM `eagle3_layers_to_capture`): k - 1."""
    return [k - 1 for k in layer_ids]


def sglang_layer_ids(layer_ids: list[int]) -> list[int]:
    """eyas/vLLM ids -> the `eagle_config` ids SGLang reads as them: output-of-layer numbering (k - 1,
    read with +1 by every release) when the first id is 2, else the boundary ids themselves (which
    SGLang >= PR #25454 reads as is; the engine rules refuse a first id of 1 for SGLang)."""
    return output_numbering(layer_ids) if layer_ids and layer_ids[0] == 2 else list(layer_ids)


def eagle_config_ids_to_input_ids(layer_ids: list[int]) -> list[int]:
    """`eagle_config` ids as SGLang (PR #25454) reads them -> eyas/vLLM ids: a list starting at 1 is
    output-of-layer numbering (ModelOpt, SpecForge: +1), any other is boundary numbering (nvidia's v3)."""
    return [j + 1 for j in layer_ids] if layer_ids and layer_ids[0] == 1 else list(layer_ids)


def dtype_name(dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (without importing torch)."""
    return str(dtype).replace("torch.", "")


def rope_fields(cfg: DraftConfig) -> dict:
    """RoPE in both spellings: `rope_parameters` (transformers >= 5, read by vLLM and TRT-LLM when
    present) and the legacy `rope_theta` + `rope_scaling` (read by SGLang and TRT-LLM's
    RopeParams.from_config through transformers 4.x configs). `rope_scaling` is null for plain RoPE."""
    rope = dict(cfg.rope_parameters)
    scaling = None
    if rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {
        "rope_theta": float(rope.get("rope_theta", 10000.0)),
        "rope_scaling": scaling,
        "rope_parameters": rope,
    }


def llama_layer_config(cfg: DraftConfig, dtype: torch.dtype) -> dict:
    """The Llama decoder-layer fields every engine builds the draft layer from."""
    return {
        "model_type": "llama",  # transformers AutoConfig -> LlamaConfig (vLLM, SGLang, TRT-LLM)
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,  # vLLM/SGLang LlamaMLP, TRT-LLM GatedMLP
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,  # explicit: speculators doubles hidden_size for its rotary config
        "num_hidden_layers": cfg.num_layers,  # draft decoder layers (vLLM/SGLang/TRT-LLM build this many)
        "hidden_act": cfg.hidden_act,  # vLLM/SGLang LlamaMLP accept only "silu"
        "rms_norm_eps": cfg.rms_norm_eps,
        "vocab_size": cfg.vocab_size,  # target vocab: embed_tokens rows, size of the scattered logits
        "max_position_embeddings": cfg.max_position_embeddings,
        **rope_fields(cfg),
        "attention_bias": False,  # vLLM: qkv bias = attention_bias; SGLang hard-codes no bias
        "mlp_bias": False,
        "tie_word_embeddings": False,  # SGLang: true would make lm_head = embed_tokens
        "torch_dtype": dtype_name(dtype),
        **window_fields(cfg),
    }


def window_fields(cfg: DraftConfig) -> dict:
    """draft.sliding_window as vLLM's llama.py reads it for an EAGLE-3 draft: `layer_types` indexed by draft
    layer ("sliding_attention" -> per_layer_sliding_window = `sliding_window`); nothing without a window."""
    if not cfg.sliding_window:
        return {}
    return {"layer_types": ["sliding_attention"] * cfg.num_layers, "sliding_window": cfg.sliding_window}


def eagle3_config(cfg: DraftConfig, dtype: torch.dtype, kind: DraftKind) -> dict:
    """config.json of the eagle3 (release) layout of `cfg`'s draft, of `kind` (a P-EAGLE draft: plus the keys
    its kind adds, DraftKind.parallel_keys: its mask token, which vLLM 0.32's llm_base_proposer reads for
    the mask slots, served with `"parallel_drafting": true`; its weights add `mask_hidden` (1, n_aux * H_t),
    which llama_eagle3.py requires then)."""
    return {
        **kind.parallel_keys(cfg),
        "architectures": [EAGLE3_ARCHITECTURE],
        **llama_layer_config(cfg, dtype),
        # lm_head rows. SGLang: absent/null means "take lm_head from the target" (full vocab);
        # vLLM: absent means draft_vocab_size = vocab_size; TRT-LLM: d2t only if it differs.
        "draft_vocab_size": cfg.draft_vocab_size,
        # fc input = target_hidden_size * n_aux (vLLM, SGLang: `hidden_size_in * 3`, TRT-LLM)
        "target_hidden_size": cfg.target_hidden_size,
        # vLLM llama_eagle3: true = the first layer's residual is hidden_norm(h)
        "norm_before_residual": cfg.norm_before_residual,
        # vLLM llama_eagle3 (top level or eagle_config): RMSNorm `input_norm` over the aux states before fc
        "norm_before_fc": cfg.norm_before_fc,
        # vLLM llama_eagle3: true = the next step's h is the final norm's output
        "norm_output": cfg.norm_output,
        # vLLM / SGLang size fc from this (else from the eagle_config ids, else 3)
        "num_aux_hidden_states": len(cfg.aux_layer_ids),
        # vLLM gpu_model_runner reads this first; input-of-layer-k numbering (id N: the last layer's output)
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "eagle_config": {
            # SGLang reads only this (ids starting at 1: +1; else as is);
            # TRT-LLM reads norm_before_fc only here
            "eagle_aux_hidden_state_layer_ids": sglang_layer_ids(cfg.aux_layer_ids),
            "norm_before_fc": cfg.norm_before_fc,
            # vLLM LlamaModel / SGLang eagle worker: false would drop fc (EAGLE-1 style input)
            "use_aux_hidden_state": True,
        },
    }


def speculators_config(
    cfg: DraftConfig,
    dtype: torch.dtype,
    num_speculative_tokens: int,
    verifier: str,
    verifier_architectures: list[str],
    kind: DraftKind,
) -> dict:
    """config.json of the speculators layout (vLLM SpeculatorsConfig + speculators Eagle3SpeculatorConfig)
    of `cfg`'s draft, of `kind`."""
    return {
        "architectures": [SPECULATORS_ARCHITECTURE],
        # vLLM detects the format by this key; "eagle3" selects update_eagle3 in algos.py, "peagle"
        # update_peagle (mask_token_id -> pard_token) and a speculative config with parallel_drafting
        "speculators_model_type": kind.speculators_type,
        **{k: v for k, v in kind.parallel_keys(cfg).items() if k == "mask_token_id"},
        # vLLM: becomes the draft's hf_config (architectures replaced by Eagle3LlamaForCausalLM)
        "transformer_layer_config": llama_layer_config(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        # vLLM algos.update_eagle3 defaults this to TRUE when absent (the speculators library
        # defaults to false): always written
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,  # vLLM PR #38111 / speculators `input_norm`
        "norm_output": cfg.norm_output,  # vLLM algos.update_eagle3 (absent: false)
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),  # input-of-layer-k numbering
        "embed_requires_grad": False,
        "torch_dtype": dtype_name(dtype),
        "speculators_config": {
            "algorithm": cfg.kind,
            "default_proposal_method": "greedy",
            # vLLM SpeculatorsConfig: proposal_methods[0].speculative_tokens becomes
            # num_speculative_tokens (required by validate_speculators_config)
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": num_speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            # vLLM requires verifier.name_or_path: `vllm serve DRAFT` loads this as the target
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
    }
