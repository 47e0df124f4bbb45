"""What each serving engine can serve: checks run at export, per engine, with the reason.

A draft that an engine would load but run differently from eyas (wrong aux layers, a different
RoPE, a freshly initialised embedding) is worse than one it refuses to load: acceptance just
quietly drops. So every requirement below is a hard refusal at export for that engine, naming
the engine, the source file it comes from, and the offending value. Notes are differences
that do not change which weights run and only slightly change the numbers; they are printed
and go into the model card.

Requirements, with the source read (stored copies; versions as of the copies read):
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
  vLLM (vllm/model_executor/models/llama_eagle3.py)
    - exactly 3 aux states: fc is built as `target_hidden_size * 3`.
    - hidden_size != target_hidden_size needs embed_tokens in the checkpoint: vllm/v1/spec_decode/
      eagle.py shares the target's embedding only when the shapes match.
  SGLang (python/sglang/srt/models/llama_eagle3.py, speculative/eagle_worker.py)
    - exactly 3 aux states: fc is `hidden_size_in * 3`.
    - hidden_size == target_hidden_size: the EAGLE-3 worker always replaces embed_tokens with
      the target's (`set_embed`), and fc is applied only when the incoming width differs from
      the embedding width (so n_aux * target_hidden_size must differ from hidden_size).
    - note: YaRN without `truncate` support (layers/rotary_embedding.py) — a yarn RoPE with
      `truncate: false` (gpt-oss) gets slightly different low/high correction bounds.
  TensorRT-LLM (tensorrt_llm/_torch/models/modeling_speculative.py, attention_backend/interface.py)
    - any number of aux states, given as `eagle3_layers_to_capture` (output numbering) in the
      serving YAML; without it TRT-LLM captures {1, N//2-1, N-4} (= eyas [2, N//2, N-3]).
    - hidden_size != target_hidden_size needs embed_tokens in the checkpoint (Eagle3DraftModel
      creates its own embedding only then; otherwise the target's is shared).
    - note: RopeParams.from_config has no YaRN `truncate` either.
"""

from __future__ import annotations

from eyas.train.model import DraftConfig

ENGINES = ("vllm", "sglang", "trtllm")
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
# which engines load each published layout (serve/formats.py)
FORMAT_ENGINES = {"eagle3": ("vllm", "sglang", "trtllm"), "speculators": ("vllm",)}

SERVABLE_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _common_problems(cfg: DraftConfig) -> list[str]:
    problems = []
    rope_type = cfg.rope_parameters.get("rope_type", "default")
    if rope_type not in SERVABLE_ROPE_TYPES:
        problems.append(
            f"rope_type {rope_type!r}: eyas computes RoPE once at load, the engines compute "
            f"{rope_type!r} from the running sequence length (servable: {', '.join(SERVABLE_ROPE_TYPES)})")
    ids = list(cfg.aux_layer_ids)
    if any(b <= a for a, b in zip(ids, ids[1:])):
        problems.append(
            f"aux_layer_ids {ids} are not strictly increasing: engines concatenate captured states "
            "in layer order, so fc's input blocks would be permuted")
    if ids and min(ids) < 1:
        problems.append(
            f"aux_layer_ids {ids} contain {min(ids)}: id 0 (the embedding output) cannot be captured "
            "(llama-family models add a None residual there; SGLang/TRT-LLM number aux states by the "
            "layer whose output they are)")
    return problems


def _three_aux(cfg: DraftConfig, engine: str, source: str) -> list[str]:
    n = len(cfg.aux_layer_ids)
    if n == 3:
        return []
    return [f"{n} aux layers {list(cfg.aux_layer_ids)}: {ENGINE_LABELS[engine]} builds fc for exactly 3 "
            f"aux states ({source})"]


def _own_embedding(cfg: DraftConfig, engine: str, include_embeddings: bool, source: str) -> list[str]:
    if cfg.hidden_size == cfg.target_hidden_size or include_embeddings:
        return []
    return [f"hidden_size {cfg.hidden_size} != target_hidden_size {cfg.target_hidden_size}: "
            f"{ENGINE_LABELS[engine]} then loads embed_tokens from the draft checkpoint ({source}); "
            "export with --include-embeddings"]


def problems(cfg: DraftConfig, engine: str, include_embeddings: bool) -> list[str]:
    """Reasons `engine` cannot serve this draft as eyas trained it (empty: it can)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    found = _common_problems(cfg)
    if engine == "vllm":
        found += _three_aux(cfg, engine, "vllm/model_executor/models/llama_eagle3.py")
        found += _own_embedding(cfg, engine, include_embeddings, "vllm/v1/spec_decode/eagle.py")
    elif engine == "sglang":
        found += _three_aux(cfg, engine, "python/sglang/srt/models/llama_eagle3.py")
        if cfg.hidden_size != cfg.target_hidden_size:
            found.append(f"hidden_size {cfg.hidden_size} != target_hidden_size {cfg.target_hidden_size}: "
                         "SGLang always uses the target's embedding for an EAGLE-3 draft "
                         "(python/sglang/srt/speculative/eagle_worker.py set_embed)")
        elif len(cfg.aux_layer_ids) * cfg.target_hidden_size == cfg.hidden_size:
            found.append("n_aux * target_hidden_size == hidden_size: SGLang applies fc only when the "
                         "incoming width differs from the embedding width")
    else:
        found += _own_embedding(cfg, engine, include_embeddings,
                                "tensorrt_llm/_torch/models/modeling_speculative.py")
    return found


def notes(cfg: DraftConfig, engine: str) -> list[str]:
    """Known small numeric differences between eyas and `engine` for this draft."""
    rope = cfg.rope_parameters
    if engine in ("sglang", "trtllm") and rope.get("rope_type") == "yarn" and rope.get("truncate") is False:
        return [f"{ENGINE_LABELS[engine]}'s YaRN has no `truncate` option and truncates the correction "
                "range; this draft's RoPE uses truncate=false, so draft RoPE frequencies differ slightly "
                "(acceptance may drop a little; outputs stay lossless)"]
    return []
