"""The published EAGLE-3 draft layouts eyas writes: tensor names, config.json, shapes and dtypes.

Two layouts are written (`eyas export --format ...`), and the importer reads them back:

  eagle3       The original EAGLE-3 release layout (SafeAILab `LlamaForCausalLMEagle3`, also what
               SpecForge writes). Tensors `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`
               and optionally `embed_tokens`; a flat Llama config.json. Served by vLLM, SGLang
               and TensorRT-LLM.
  speculators  vLLM's `speculators` format (vllm-project/speculators `Eagle3Speculator`). The same
               tensors with the decoder layer named `layers.0.*`; config.json carries
               `speculators_model_type: "eagle3"`, a nested `transformer_layer_config` and a
               `speculators_config` naming the verifier and the number of speculative tokens,
               so `vllm serve DRAFT_DIR` alone starts target + draft. Served by vLLM.

Sources read for every field below (the stored copies of each project):
  vLLM     vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM, LlamaModel.load_weights),
           vllm/transformers_utils/configs/speculators/{base,algos}.py,
           vllm/v1/worker/gpu_model_runner.py (_get_eagle3_aux_layers_from_config),
           vllm/v1/spec_decode/eagle.py (embed_tokens sharing), llama.py (aux capture)
  SGLang   python/sglang/srt/models/llama_eagle3.py (LlamaForCausalLMEagle3.load_weights),
           python/sglang/srt/models/llama.py (set_eagle3_layers_to_capture: `val + 1`),
           python/sglang/srt/speculative/eagle_worker.py (set_embed from the target)
  TRT-LLM  tensorrt_llm/_torch/models/modeling_speculative.py (Eagle3DraftModel, load_weights
           `layers.0.` -> `midlayer.`), llmapi/llm_args.py (eagle3_layers_to_capture)
  speculators  src/speculators/models/eagle3/{config,core,model_definitions}.py, model.py
  ModelOpt modelopt/torch/export/plugins/hf_spec_export.py (LLAMA_EAGLE_SINGLE_LAYER keys,
           llama_eagle_template_config), speculative/plugins/transformers.py (aux-layer hooks)

The config.json fields, the aux-layer id conventions and the options: train/kinds/config_json.py (torch-free:
the training checkpoint writes them too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from eyas.train.kinds import KINDS, make_draft
from eyas.train.kinds.config import DraftConfig

# every kind's layouts (DraftKind.formats): EAGLE-3's release layout, speculators', and a kind's own
FORMATS = tuple(dict.fromkeys(f for k in KINDS.values() for f in k.formats))
# Published prefix of the single decoder layer -> eyas's prefix. `midlayer.` is the release
# name (SGLang loads ONLY this name: an unknown `layers.0.*` is silently skipped there);
# `layers.0.` is the speculators / ModelOpt name (vLLM maps `midlayer.` -> `layers.0.`,
# TRT-LLM maps `layers.0.` -> `midlayer.`, so both engines take either).
LAYER_PREFIX = {"eagle3": "midlayer.", "speculators": "layers.0."}
EYAS_LAYER_PREFIX = "midlayer."

INDEX_DTYPES = {"d2t": torch.int64, "t2d": torch.bool}  # vLLM draft_id_to_target_id is torch.long


def parse_dtype(name: str) -> torch.dtype:
    table = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if name not in table:
        raise ValueError(f"unsupported dtype {name!r}; choose one of {sorted(table)}")
    return table[name]


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of an export: its published name, the eyas state-dict entry it comes from,
    and the shape and dtype it is written with."""

    name: str
    source: str
    shape: tuple[int, ...]
    dtype: torch.dtype


# P-EAGLE's learned mask-slot aux states: eyas's `mask_hidden` (train/kinds/peagle MaskHidden), the tensor
# `mask_hidden` in vLLM's llama_eagle3.py and speculators' PEagleDraftModel
MASK_HIDDEN = ("mask_hidden.weight", "mask_hidden")


def published_name(eyas_name: str, fmt: str) -> str:
    if eyas_name == MASK_HIDDEN[0]:
        return MASK_HIDDEN[1]
    if eyas_name.startswith(EYAS_LAYER_PREFIX):
        return LAYER_PREFIX[fmt] + eyas_name[len(EYAS_LAYER_PREFIX) :]
    return eyas_name


def writes_vocab_map(cfg: DraftConfig, fmt: str) -> bool:
    """The speculators library registers d2t/t2d only when the draft vocab is smaller than the
    target's (DraftVocabMixin._init_vocab), vLLM's DFlash model likewise; the eagle3 layout always carries
    them."""
    return fmt == "eagle3" or cfg.draft_vocab_size != cfg.vocab_size


def meta_state_shapes(cfg: DraftConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Names, shapes and dtypes of an Eagle3Draft's state dict, without allocating it.

    Built on the meta device. RoPE has no persistent state, so it is replaced by plain RoPE for
    the build (transformers' YaRN init cannot run on meta tensors)."""
    plain = dataclasses.replace(cfg, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with torch.device("meta"):
        draft = make_draft(plain)
    return {n: (tuple(t.shape), t.dtype) for n, t in draft.state_dict().items()}


def plan_tensors(
    cfg: DraftConfig, fmt: str, dtype: torch.dtype, include_embeddings: bool
) -> list[TensorPlan]:
    """Every tensor an export of `cfg` in `fmt` writes, in a fixed order."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    plan = []
    for name, (shape, src_dtype) in meta_state_shapes(cfg).items():
        if name == "embed_tokens.weight" and not include_embeddings:
            continue
        if name in INDEX_DTYPES and not writes_vocab_map(cfg, fmt):
            continue
        out_dtype = INDEX_DTYPES.get(name, dtype if src_dtype.is_floating_point else src_dtype)
        if name == MASK_HIDDEN[0] and fmt == "speculators":
            shape = (1, *shape)  # speculators' PEagleDraftModel holds (1, 1, n_aux * H); vLLM views (1, -1)
        plan.append(TensorPlan(published_name(name, fmt), name, shape, out_dtype))
    return plan


def identity_vocab_map(draft_vocab_size: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t/t2d of a draft vocab equal to the target's (draft id i = target id i)."""
    if draft_vocab_size != vocab_size:
        raise ValueError(
            f"an identity vocab map needs draft_vocab_size == vocab_size, "
            f"got {draft_vocab_size} and {vocab_size}"
        )
    return torch.zeros(draft_vocab_size, dtype=torch.int64), torch.ones(vocab_size, dtype=torch.bool)


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.arange(d2t.numel()) + d2t.to(torch.int64)] = True
    return t2d


def check_vocab_map(
    d2t: torch.Tensor, t2d: torch.Tensor, draft_vocab_size: int, vocab_size: int, where: str
) -> None:
    """d2t must map the draft ids one-to-one into the target vocab (target id = i + d2t[i]; engines
    use only d2t: vLLM draft_id_to_target_id, SGLang hot_token_id = d2t + arange) and t2d must mark
    exactly those target ids (eyas's loss uses t2d)."""
    if tuple(d2t.shape) != (draft_vocab_size,) or tuple(t2d.shape) != (vocab_size,):
        raise ValueError(
            f"{where}: d2t shape {tuple(d2t.shape)} / t2d shape {tuple(t2d.shape)}, expected "
            f"({draft_vocab_size},) / ({vocab_size},)"
        )
    targets = torch.arange(draft_vocab_size) + d2t.to(torch.int64)
    if draft_vocab_size and (targets.min() < 0 or targets.max() >= vocab_size):
        raise ValueError(f"{where}: d2t maps draft ids outside the target vocab [0, {vocab_size})")
    if targets.unique().numel() != draft_vocab_size:
        raise ValueError(f"{where}: d2t maps two draft ids to the same target id")
    if int(t2d.sum()) != draft_vocab_size or not bool(t2d.to(torch.bool)[targets].all()):
        raise ValueError(f"{where}: t2d does not mark exactly the target ids that d2t maps to")


def describe_export_keys(
    cfg: DraftConfig,
    fmt: str = "eagle3",
    dtype: torch.dtype = torch.bfloat16,
    include_embeddings: bool = False,
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{published tensor name: (shape, dtype)} of an export, computed without allocating weights."""
    return {p.name: (p.shape, p.dtype) for p in plan_tensors(cfg, fmt, dtype, include_embeddings)}
