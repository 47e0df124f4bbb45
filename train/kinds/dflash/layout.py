"""The published DFlash draft layouts (train/kinds/dflash/core.py): config.json both ways, read back.
Torch-free (transformers' Qwen3Config is read when a published config is).

  dflash       z-lab's release layout (z-lab/gpt-oss-120b-DFlash, ...), which vLLM 0.32 serves with
               `{"method": "dflash", "model": DIR, "num_speculative_tokens": block_size - 1}`:
               `architectures: ["DFlashDraftModel"]` (vLLM registry -> qwen3_dflash.py
               DFlashQwen3ForCausalLM), a flat Qwen3 config, `block_size`, and `dflash_config` with
               `mask_token_id` and `target_layer_ids`.
  speculators  speculators 0.9.0's `speculators_model_type: "dflash"` (DFlashSpeculatorConfig):
               `transformer_layer_config` (Qwen3), `aux_hidden_state_layer_ids`, `mask_token_id`,
               `block_size`; vLLM's algos.update_dflash turns it into the above.

Tensors (both layouts, eyas's own names): `fc`, `hidden_norm`, `layers.{i}.self_attn.{q,k,v,o}_proj`
(+ `.bias` with attention_bias), `layers.{i}.self_attn.{q,k}_norm`, `layers.{i}.{input,post_attention}_
layernorm`, `layers.{i}.mlp.{gate,up,down}_proj`, `norm`, `lm_head`, and `d2t` / `t2d` only when the draft
vocab is smaller than the target's (vLLM builds `draft_id_to_target_id` only then, speculators'
DraftVocabMixin likewise).

Layer ids: eyas (vLLM) id k = the input of decoder layer k. DFlash's `target_layer_ids` number the OUTPUT of
decoder layer j = k - 1 (vLLM's get_eagle3_aux_layers_from_config adds 1; z-lab's gpt-oss-120b [1, 9, 17,
25, 33] are eyas ids [2, 10, 18, 26, 34]); speculators' `aux_hidden_state_layer_ids` are eyas's own
(update_dflash subtracts 1 for dflash_config). Sources: vllm/model_executor/models/qwen3_dflash.py,
vllm/transformers_utils/configs/speculators/algos.py (update_dflash), vllm/v1/worker/gpu/spec_decode/eagle/
eagle3_utils.py, speculators/models/dflash/{config,core}.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import DraftConfig
from ..config_json import dtype_name, rope_fields

if TYPE_CHECKING:  # annotations only
    import torch

ARCHITECTURE = "DFlashDraftModel"  # z-lab's config.json architectures entry (vLLM's qwen3_dflash.py)


def qwen3_layer_config(cfg: DraftConfig, dtype: torch.dtype) -> dict:
    """The Qwen3 decoder fields vLLM's qwen3_dflash.py builds the layers from."""
    return {
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        **rope_fields(cfg),
        "attention_bias": cfg.attention_bias,
        "tie_word_embeddings": False,
        "torch_dtype": dtype_name(dtype),
    }


def dflash_config(cfg: DraftConfig, dtype: torch.dtype) -> dict:
    """config.json of z-lab's layout (vLLM method "dflash")."""
    return {
        "architectures": [ARCHITECTURE],
        **qwen3_layer_config(cfg, dtype),
        "block_size": cfg.block_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        # every layer non-causal within the block (vLLM _dflash_layer_causal: no layer_types -> False)
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": [k - 1 for k in cfg.aux_layer_ids],  # output-of-layer numbering
        },
    }


def dflash_speculators_config(
    cfg: DraftConfig, dtype: torch.dtype, verifier: str, verifier_architectures: list[str]
) -> dict:
    """config.json of speculators' DFlash layout (vLLM SpeculatorsConfig, algos.update_dflash)."""
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": qwen3_layer_config(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "block_size": cfg.block_size,
        "aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),  # eyas / vLLM numbering
        "mask_token_id": cfg.mask_token_id,
        "sample_from_anchor": False,  # slot 0 is the anchor (vLLM's DFlash proposer samples slots 1..)
        "sliding_window_non_causal": True,  # update_dflash: causal = not this
        "torch_dtype": dtype_name(dtype),
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": cfg.block_size - 1,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
    }


def read_dflash_config(raw: dict, target: str | None, where: str) -> DraftConfig:
    """DraftConfig of a published DFlash config.json (either layout); ValueError naming what eyas's layer
    lacks (the importer reports it as a DraftFormatError)."""
    from transformers import Qwen3Config

    speculators = raw.get("speculators_model_type") == "dflash"
    base = raw["transformer_layer_config"] if speculators else raw
    inner = raw.get("dflash_config") or {}
    for key, bad in (("sample_from_anchor", True), ("causal", True), ("use_swa", True)):
        if raw.get(key) is bad or inner.get(key) is bad:
            raise ValueError(
                f"{where}: {key} = {bad}; eyas's DFlash layer drafts from the mask slots, non-causal"
            )
    if base.get("layer_types") and set(base["layer_types"]) != {"full_attention"}:
        raise ValueError(f"{where}: layer_types {base['layer_types']}: eyas's DFlash layers attend fully")
    # a Qwen3Config whatever model_type says: z-lab's DFlashDraftModel (config_class = Qwen3Config) reads its
    # gpt-oss drafts' `model_type: gpt_oss` configs so (full attention, plain RoPE unless the config has more)
    fields = {k: v for k, v in base.items() if k not in ("model_type", "architectures") and v is not None}
    lcfg = Qwen3Config(**fields)
    if speculators:
        ids, mask = list(raw["aux_hidden_state_layer_ids"]), raw.get("mask_token_id")
    else:
        ids, mask = [j + 1 for j in inner.get("target_layer_ids") or []], inner.get("mask_token_id")
    block = raw.get("block_size") or base.get("block_size")
    if not ids or mask is None or not block:
        raise ValueError(f"{where}: a DFlash draft needs target layer ids, a mask_token_id and a block_size")
    rope = dict(getattr(lcfg, "rope_parameters", None) or {})
    rope["rope_theta"] = float(rope.get("rope_theta", getattr(lcfg, "rope_theta", 10000.0)))
    return DraftConfig(
        hidden_size=lcfg.hidden_size,
        num_attention_heads=lcfg.num_attention_heads,
        num_key_value_heads=lcfg.num_key_value_heads,
        head_dim=getattr(lcfg, "head_dim", None) or lcfg.hidden_size // lcfg.num_attention_heads,
        intermediate_size=lcfg.intermediate_size,
        vocab_size=lcfg.vocab_size,
        draft_vocab_size=int(raw.get("draft_vocab_size") or lcfg.vocab_size),
        aux_layer_ids=[int(k) for k in ids],
        target_hidden_size=int(raw.get("target_hidden_size") or lcfg.hidden_size),
        rms_norm_eps=float(lcfg.rms_norm_eps),
        max_position_embeddings=lcfg.max_position_embeddings,
        rope_parameters=rope,
        hidden_act=lcfg.hidden_act,
        target_model=target,
        num_layers=int(lcfg.num_hidden_layers),
        kind="dflash",
        mask_token_id=int(mask),
        block_size=int(block),
        attention_bias=bool(getattr(lcfg, "attention_bias", False)),
    )
