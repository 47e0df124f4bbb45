"""`eyas import`: read a published EAGLE-3 draft into an eyas checkpoint.

Layouts read (see serve/interchange/formats.py for the sources):
  eagle3       SafeAILab EAGLE-3 release / SpecForge / eyas export: `LlamaForCausalLMEagle3`,
               tensors `midlayer.*` (also accepted: `layers.0.*`, and a leading `model.`),
               `pytorch_model.bin` or safetensors, aux ids top level and/or in `eagle_config`.
  modelopt     NVIDIA ModelOpt export: `LlamaForCausalLMEagle3` with an `eagle_config` block
               (use_input_layernorm_in_first_layer, use_last_layernorm, ...), tensors
               `layers.0.*`, no embed_tokens / t2d, d2t optional.
  speculators  vLLM speculators `speculators_model_type: "eagle3"` with `transformer_layer_config`.
  dflash       a DFlash draft (train/kinds/dflash/layout.py): z-lab's `DFlashDraftModel` config.json
               (read as a Qwen3Config whatever its model_type, as z-lab's DFlashDraftModel reads it: its
               config_class; z-lab's gpt-oss drafts say `gpt_oss`) or speculators `dflash`; names kept.
  eyas         an eyas checkpoint (config.json "eyas" block), re-saved.

What is filled in the way the engines would fill it:
  - embed_tokens missing: the target's (every engine shares the target's embedding).
  - lm_head missing with a full-size draft vocab: the target's lm_head (SGLang/TRT-LLM do this).
  - d2t/t2d missing with draft_vocab_size == vocab_size: the identity map.
  - aux layer ids: top-level `eagle_aux_hidden_state_layer_ids` as is (vLLM reads it first; input of
    layer k, id N the last layer's output); else the `eagle_config` ids as SGLang reads them (a list
    starting at 1 is output numbering, +1 — ModelOpt, SpecForge; any other is boundary numbering —
    nvidia/gpt-oss-120b-Eagle3-v3's [24, 30, 36]); else the engines' default [2, N//2, N-3].
  - the options, as vLLM reads them: `norm_before_fc` from `eagle_config`, else the top level
    (weight `input_norm.weight`); `norm_before_residual` from the top level (absent: false, except
    in the speculators format, where vLLM assumes true and the library false: refused as ambiguous);
    `num_hidden_layers` decoder layers named `midlayer.*` / `layers.0.*` / `midlayer.0.*`, then
    `layers.i.*` / `midlayer.i.*`.
Features the eyas layer does not have (fc_norm, norm_output, biases, non-SiLU MLP, a Qwen3 layer
with q/k norms, ...) are refused by name.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from eyas.data.hub import model_errors
from eyas.data.target import load_head_weights, load_target_config, text_config
from eyas.infra.errors import InputError, as_input
from eyas.train.checkpoint import save_draft
from eyas.train.kinds import KINDS, kind_of, make_draft, published_kind
from eyas.train.kinds.config import DraftConfig
from eyas.train.kinds.config_json import EAGLE3_ARCHITECTURE, eagle_config_ids_to_input_ids
from eyas.train.kinds.peagle import mask_token_of
from eyas.train.model import Eagle3Draft

from .formats import (
    EYAS_LAYER_PREFIX,
    MASK_HIDDEN,
    check_vocab_map,
    identity_vocab_map,
    meta_state_shapes,
    parse_dtype,
    t2d_from_d2t,
)

EAGLE3_LAYOUTS = ("eagle3", "modelopt", "speculators")  # read here; a kind's own layout, by the kind
LAYOUTS = (
    "eyas",
    *EAGLE3_LAYOUTS,
    *(k.formats[0] for k in KINDS.values() if k.formats[0] not in EAGLE3_LAYOUTS),
)

# Tensors some published drafts carry that are not part of the served draft: the speculators
# trainer's frozen verifier head/norm, and RoPE buffers old HF checkpoints stored.
IGNORED_TENSORS = ("verifier_lm_head.weight", "verifier_norm.weight")
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

# ModelOpt eagle_config switches and the value the eyas layer corresponds to (None = default).
MODELOPT_SWITCHES = {
    "use_input_layernorm_in_first_layer": True,  # input_layernorm on the embeddings
    "use_last_layernorm": True,  # final `norm` before lm_head
    "use_mtp_layernorm": False,
    "use_aux_hidden_state": True,  # fc over aux states (EAGLE-3, not EAGLE-1)
    "eh_proj_before_attn": False,  # TRT-LLM
    "return_hidden_post_norm": False,  # TRT-LLM
    "next_layer_regular": True,  # TRT-LLM: later layers are plain Llama layers
}
# eagle_config keys that mark an NVIDIA ModelOpt export (beyond the switches above)
MODELOPT_KEYS = ("norm_before_fc", "parallel_draft_step")
# top-level switches (vLLM llama_eagle3 / speculators) the eyas layer does not implement when true.
UNSUPPORTED_SWITCHES = ("fc_norm", "use_aux_norm")


class DraftFormatError(InputError, ValueError):
    """A published draft this importer cannot read faithfully; the message names what and where."""


def fetch(src: str | Path, revision: str | None = None) -> Path:
    """A local directory as is, else a hub repo id downloaded with huggingface_hub."""
    path = Path(src)
    if path.is_dir():
        return path
    if path.exists():
        raise DraftFormatError(f"{src}: not a directory (give a draft directory or a hub repo id)")
    from huggingface_hub import snapshot_download

    with model_errors(str(src), "SRC"):  # not on the hub, gated, or the hub unreachable: one line naming it
        return Path(
            snapshot_download(
                str(src), revision=revision, allow_patterns=["*.json", "*.safetensors", "*.bin", "*.md"]
            )
        )


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a draft directory: safetensors files (sharded or not), else pytorch_model*.bin."""
    files = sorted(f for f in path.glob("*.safetensors") if not f.name.startswith("adapter_"))
    if files:
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise DraftFormatError(f"{path}: no *.safetensors or pytorch_model*.bin weights")
    state = {}
    for f in bins:
        state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def detect_layout(raw: dict, where: str) -> str:
    if "eyas" in raw:
        return "eyas"
    if "speculators_model_type" not in raw:  # a kind's layout of its own (DFlash's z-lab layout): its name
        own = [
            k.formats[0] for k in KINDS.values() if k.formats[0] not in EAGLE3_LAYOUTS and k.published(raw)
        ]
        if own:
            return own[0]
    if "speculators_model_type" in raw:
        types = [k.speculators_type for k in KINDS.values()]
        if raw["speculators_model_type"] not in types:
            raise DraftFormatError(
                f"{where}: speculators_model_type {raw['speculators_model_type']!r}; "
                f"only {', '.join(map(repr, types))} drafts can be imported"
            )
        return "speculators"
    architectures = raw.get("architectures") or []
    if EAGLE3_ARCHITECTURE not in architectures:
        raise DraftFormatError(
            f"{where}: architectures {architectures}; expected {EAGLE3_ARCHITECTURE!r} "
            "(EAGLE-3 release / SpecForge / ModelOpt) or a speculators eagle3 config"
        )
    eagle_config = raw.get("eagle_config") or {}
    marks = (set(MODELOPT_SWITCHES) - {"use_aux_hidden_state"}) | set(MODELOPT_KEYS)
    return "modelopt" if set(eagle_config) & marks else "eagle3"


def _check_switches(raw: dict, layout: str, where: str) -> None:
    eagle_config = raw.get("eagle_config") or {}
    for key, wanted in MODELOPT_SWITCHES.items():
        value = eagle_config.get(key)
        if value is not None and bool(value) != wanted:
            raise DraftFormatError(
                f"{where}: eagle_config.{key} = {value!r}; the EAGLE-3 layer eyas "
                f"implements has {key} = {wanted}"
            )
    parallel = eagle_config.get("parallel_draft_step")
    if parallel is not None and parallel > 1:
        raise DraftFormatError(
            f"{where}: eagle_config.parallel_draft_step = {parallel} (parallel drafting "
            "heads are not part of the eyas draft)"
        )
    if layout == "speculators" and "norm_before_residual" not in raw:
        raise DraftFormatError(
            f"{where}: no norm_before_residual; vLLM assumes true when it is absent, the speculators "
            "library false, so the layer is ambiguous"
        )
    for key in UNSUPPORTED_SWITCHES:
        if raw.get(key):
            raise DraftFormatError(
                f"{where}: {key} = {raw[key]!r}; the eyas layer has no {key} "
                "(fc on the aux states as one block)"
            )


def _layer_config(raw: dict, layout: str, where: str):
    """The Llama layer config as the engines see it (transformers LlamaConfig defaults apply)."""
    from transformers import LlamaConfig

    base = raw["transformer_layer_config"] if layout == "speculators" else raw
    if not isinstance(base, dict):
        raise DraftFormatError(f"{where}: transformer_layer_config must be a mapping")
    model_type = base.get("model_type", "llama")
    if model_type != "llama":
        raise DraftFormatError(
            f"{where}: decoder layer model_type {model_type!r}; only the Llama layer "
            "(no q/k norms) is implemented by eyas"
        )
    # null fields (ModelOpt's template writes unset ones as null) take LlamaConfig's defaults
    lcfg = LlamaConfig(**{k: v for k, v in base.items() if k != "model_type" and v is not None})
    if lcfg.hidden_act != "silu":
        raise DraftFormatError(
            f"{where}: hidden_act = {lcfg.hidden_act!r}; the eyas draft has hidden_act = 'silu'"
        )
    for key in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
        if getattr(lcfg, key, False):
            raise DraftFormatError(f"{where}: {key} = true; the eyas draft has {key} = false")
    return lcfg


def _aux_layer_ids(raw: dict, target_layers: int | None, where: str, notes: list[str]) -> list[int]:
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top:
        if nested and eagle_config_ids_to_input_ids(nested) != list(top):
            notes.append(
                f"eagle_config ids {list(nested)} (as SGLang reads them: "
                f"{eagle_config_ids_to_input_ids(nested)}) disagree with top-level ids {list(top)}; "
                "using the top-level ids as vLLM does"
            )
        return [int(i) for i in top]
    if nested:
        return eagle_config_ids_to_input_ids([int(i) for i in nested])
    if target_layers is None:
        raise DraftFormatError(
            f"{where}: no eagle_aux_hidden_state_layer_ids; pass --target so the engines' "
            "default [2, N//2, N-3] can be taken from the target's layer count"
        )
    ids = [2, target_layers // 2, target_layers - 3]
    notes.append(
        f"no aux layer ids in the config; using the engines' default {ids} for a {target_layers}-layer target"
    )
    return ids


def _target_name(raw: dict, layout: str, target: str | None) -> str | None:
    if target:
        return target
    if layout == "speculators":
        return ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return None


def published_config(raw: dict, layout: str, target: str | None, where: str, notes: list[str]) -> DraftConfig:
    """DraftConfig of a published (non-eyas) draft config.json."""
    _check_switches(raw, layout, where)
    lcfg = _layer_config(raw, layout, where)
    target_layers = None
    if (
        not (
            raw.get("eagle_aux_hidden_state_layer_ids")
            or (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        )
        and target
    ):
        target_layers = text_config(load_target_config(target)).num_hidden_layers
    rope = dict(lcfg.rope_parameters)
    rope["rope_theta"] = float(rope.get("rope_theta", 10000.0))
    # absent draft_vocab_size / target_hidden_size: vLLM and TRT-LLM default them to vocab_size / hidden_size
    draft_vocab = raw.get("draft_vocab_size") or lcfg.vocab_size
    target_hidden = raw.get("target_hidden_size") or lcfg.hidden_size
    eagle_config = raw.get("eagle_config") or {}
    parallel = _parallel(raw, where)
    return DraftConfig(
        hidden_size=lcfg.hidden_size,
        num_attention_heads=lcfg.num_attention_heads,
        num_key_value_heads=lcfg.num_key_value_heads,
        head_dim=lcfg.head_dim,
        intermediate_size=lcfg.intermediate_size,
        vocab_size=lcfg.vocab_size,
        draft_vocab_size=int(draft_vocab),
        aux_layer_ids=_aux_layer_ids(raw, target_layers, where, notes),
        target_hidden_size=int(target_hidden),
        rms_norm_eps=float(lcfg.rms_norm_eps),
        max_position_embeddings=lcfg.max_position_embeddings,
        rope_parameters=rope,
        hidden_act=lcfg.hidden_act,
        target_model=target,
        # vLLM llama_eagle3: eagle_config first (nvidia's checkpoints), then the top level
        norm_before_fc=bool(eagle_config.get("norm_before_fc", raw.get("norm_before_fc", False))),
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        num_layers=int(lcfg.num_hidden_layers),
        # vLLM algos.update_eagle3: absent = false. P-EAGLE never feeds a draft's output back (one forward a
        # round): norm_output has no effect on it (vLLM's update_peagle drops it)
        norm_output=bool(raw.get("norm_output", False)) and not parallel,
        sliding_window=_sliding_window(raw.get("transformer_layer_config") or raw, where),
        **parallel,
    )


def _parallel(raw: dict, where: str) -> dict:
    """A parallel draft of the EAGLE-3 layouts (P-EAGLE: speculators_model_type peagle, or a mask token in
    the config: train/kinds/peagle mask_token_of) -> its kind and mask token."""
    mask, kind = mask_token_of(raw), published_kind(raw)
    if kind.mask_slots and mask is None:
        raise DraftFormatError(f"{where}: a {kind.name} draft without mask_token_id (vLLM requires it)")
    # a mask token in the config of a kind without mask slots (an EAGLE-3 draft) is not read
    return {} if mask is None or not kind.mask_slots else {"kind": kind.name, "mask_token_id": int(mask)}


def _sliding_window(layer_raw: dict, where: str) -> int | None:
    """The draft's window as vLLM's llama.py reads it: `sliding_window` on the layers whose `layer_types`
    entry is "sliding_attention" (without layer_types none). eyas's draft has one window for every layer."""
    types = layer_raw.get("layer_types") or []
    sliding = {t == "sliding_attention" for t in types}
    if sliding == {True} and layer_raw.get("sliding_window"):
        return int(layer_raw["sliding_window"])
    if True in sliding:
        raise DraftFormatError(f"{where}: layer_types {types}: a window on some draft layers only")
    return None


def normalize_names(
    state: dict[str, torch.Tensor], where: str, own_layers: bool = False
) -> dict[str, torch.Tensor]:
    """Published tensor names -> eyas names (`model.` prefix dropped; `layers.0.` / `midlayer.0.` ->
    `midlayer.`; `midlayer.i.` -> `layers.i.`; a kind with layers of its own (DFlash's Qwen3 `layers.i.`:
    own_layers) keeps them)."""
    out = {}
    for name, tensor in state.items():
        if name.startswith("model."):
            name = name[len("model.") :]
        if name in IGNORED_TENSORS or name.endswith(IGNORED_SUFFIXES):
            continue
        m = None if own_layers else re.match(r"^(?:layers|midlayer)\.(\d+)\.(.+)$", name)
        if m:
            name = (EYAS_LAYER_PREFIX if m.group(1) == "0" else f"layers.{m.group(1)}.") + m.group(2)
        if name in out:
            raise DraftFormatError(f"{where}: tensor {name} appears twice under different published names")
        if name == MASK_HIDDEN[1]:  # P-EAGLE's; speculators stores it (1, 1, n_aux * H), vLLM views (1, -1)
            name, tensor = MASK_HIDDEN[0], tensor.reshape(1, -1)
        out[name] = tensor
    return out


def _target_heads(target: str | None, what: str, where: str) -> dict[str, torch.Tensor]:
    if not target:
        raise DraftFormatError(
            f"{where}: no {what} in the draft and no target to take it from; pass --target"
        )

    return load_head_weights(target)


def complete_state(
    state: dict[str, torch.Tensor], cfg: DraftConfig, where: str, embed: torch.Tensor | None, notes: list[str]
) -> dict[str, torch.Tensor]:
    """Fill what engines take from the target or default, then check names and shapes."""
    heads: dict[str, torch.Tensor] = {}
    if "embed_tokens.weight" not in state:
        if embed is None:
            heads = heads or _target_heads(cfg.target_model, "embed_tokens.weight", where)
            embed = heads["embed"]
        state["embed_tokens.weight"] = embed
    elif cfg.target_model:
        heads = own_embedding(state, cfg, where, embed, notes)
    if "lm_head.weight" not in state:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise DraftFormatError(
                f"{where}: no lm_head.weight and draft_vocab_size {cfg.draft_vocab_size} "
                f"!= vocab_size {cfg.vocab_size}"
            )
        heads = heads or _target_heads(cfg.target_model, "lm_head.weight", where)
        state["lm_head.weight"] = heads["lm_head"]
        notes.append("no lm_head in the draft; using the target's (as SGLang and TRT-LLM do)")
    if "d2t" not in state:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise DraftFormatError(
                f"{where}: no d2t although draft_vocab_size {cfg.draft_vocab_size} < "
                f"vocab_size {cfg.vocab_size} (engines would map draft id i to target id i)"
            )
        state["d2t"], identity_t2d = identity_vocab_map(cfg.draft_vocab_size, cfg.vocab_size)
        state.setdefault("t2d", identity_t2d)
    if "t2d" not in state:
        state["t2d"] = t2d_from_d2t(state["d2t"], cfg.vocab_size)
    state["d2t"] = state["d2t"].to(torch.int64)
    state["t2d"] = state["t2d"].to(torch.bool)
    check_vocab_map(state["d2t"], state["t2d"], cfg.draft_vocab_size, cfg.vocab_size, where)

    expected = meta_state_shapes(cfg)
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise DraftFormatError(f"{where}: tensors the eyas EAGLE-3 layer does not have: {unknown}")
    missing = sorted(set(expected) - set(state))
    if missing:
        raise DraftFormatError(f"{where}: missing tensors {missing}")
    for name, (shape, _) in expected.items():
        if tuple(state[name].shape) != shape:
            raise DraftFormatError(
                f"{where}: tensor {name} has shape {tuple(state[name].shape)}, the config implies {shape}"
            )
    return state


def own_embedding(
    state: dict[str, torch.Tensor], cfg: DraftConfig, where: str, embed: torch.Tensor | None, notes: list[str]
) -> dict[str, torch.Tensor]:
    """A draft that ships embed_tokens: where it differs from the target's (a draft that trained its
    embedding, as speculators 0.9.0's P-EAGLE does by default: embed_requires_grad), it is the draft's own
    (cfg.own_embedding: loaded from its file and exported with it, as vLLM serves it), said in `notes`.
    -> the target's heads read (reused by the caller)."""
    heads: dict[str, torch.Tensor] = {}
    if embed is None:
        heads = _target_heads(cfg.target_model, "embed_tokens.weight", where)
        embed = heads["embed"]
    mine = state["embed_tokens.weight"]
    if tuple(mine.shape) == tuple(embed.shape) and torch.equal(mine.to(embed.dtype), embed):
        return heads
    cfg.own_embedding = True
    rows = int((mine.float() != embed.float()).any(-1).sum()) if mine.shape == embed.shape else mine.shape[0]
    notes.append(
        f"embed_tokens differs from the target's in {rows} rows: the draft's own (trained) embedding, "
        "kept and used wherever it runs"
    )
    return heads


def read_published(
    path: str | Path, target: str | None = None, embed: torch.Tensor | None = None
) -> tuple[DraftConfig, dict[str, torch.Tensor], str, list[str]]:
    """(DraftConfig, eyas-named state dict, layout, notes) of a local draft directory.

    `target` names the target for missing pieces (default: the one the config names);
    `embed` is the target's input embedding when the caller already has it."""
    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise DraftFormatError(f"{path}: no config.json")
    raw = json.loads(config_path.read_text())
    layout = detect_layout(raw, str(config_path))
    notes: list[str] = []
    if layout == "eyas":
        cfg = DraftConfig.from_dict(raw["eyas"]["draft_config"])
        if target:
            cfg.target_model = target
    else:
        try:  # a kind with a layout of its own reads it (DraftKind.read_published), else the EAGLE-3 reader
            cfg = published_kind(raw).read_published(
                raw, _target_name(raw, "speculators", target), str(config_path)
            )
        except ValueError as e:
            raise DraftFormatError(str(e)) from None
        if cfg is None:
            cfg = published_config(raw, layout, _target_name(raw, layout, target), str(config_path), notes)
    state = normalize_names(read_weights(path), str(path), own_layers=kind_of(cfg).own_layer_names)
    return cfg, complete_state(state, cfg, str(path), embed, notes), layout, notes


def build_draft(cfg: DraftConfig, state: dict[str, torch.Tensor], dtype: torch.dtype) -> Eagle3Draft:
    draft = make_draft(cfg)
    draft.load_state_dict(state, strict=True)
    return draft.to(dtype=dtype).eval()


def load_published(
    path: str | Path,
    target: str | None = None,
    embed: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Eagle3Draft, str, list[str]]:
    """An Eagle3Draft (eval mode) built from a published draft directory, plus its layout and notes."""
    cfg, state, layout, notes = read_published(path, target, embed)
    return build_draft(cfg, state, dtype), layout, notes


def import_draft(
    src: str | Path,
    out_dir: str | Path,
    target: str | None = None,
    revision: str | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Read a published draft (local directory or hub repo id) and save it as an eyas checkpoint,
    in `dtype` (default: the dtype the published fc weight is stored in)."""
    cfg, state, layout, notes = read_published(fetch(src, revision), target)
    for note in notes:
        print(f"eyas import: note: {note}", file=sys.stderr)
    save_dtype = dtype or state["fc.weight"].dtype
    draft = build_draft(cfg, state, torch.float32)
    return save_draft(
        draft,
        out_dir,
        dtype=save_dtype,
        extra={"imported_from": str(src), "source_layout": layout, "import_notes": notes},
    )


def main_import(argv: list[str] | None = None) -> int:
    """`eyas import SRC --out DIR [--target TARGET] [--revision REV] [--dtype DTYPE]`."""
    parser = argparse.ArgumentParser(
        prog="eyas import",
        description="Read a published EAGLE-3 draft (local "
        "directory or hub repo id) into an eyas checkpoint.",
    )
    parser.add_argument(
        "src", help="draft directory or hub repo id (EAGLE-3 release, SpecForge, ModelOpt, speculators)"
    )
    parser.add_argument("--out", required=True, help="eyas checkpoint directory to write")
    parser.add_argument(
        "--target",
        help="target model (directory or hub id) for a missing embedding, "
        "lm_head or aux layer ids; default: the verifier the config names",
    )
    parser.add_argument("--revision", help="hub revision (branch, tag or commit) of SRC")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        help="dtype to save (default: the published weights' dtype)",
    )
    args = parser.parse_args(argv)
    try:
        out = import_draft(
            args.src,
            args.out,
            target=args.target,
            revision=args.revision,
            dtype=parse_dtype(args.dtype) if args.dtype else None,
        )
    except (ValueError, OSError) as e:
        raise as_input(e) from e
    print(out)
    return 0
