"""Recipes: YAML parsed into typed, strict dataclasses.

Every error names the dotted key it is about (``train.lr``, ``capture.aux_layer_ids``…),
and all checks that need no model run before any work starts. Checks that need the
target's config (layer count, vocab size) run in :func:`check_against_target` once the
target's ``config.json`` has been read, still before any stage does work.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eyas.errors import InputError


class RecipeError(InputError, ValueError):
    """A recipe key is unknown, has the wrong type or an impossible value."""


# --------------------------------------------------------------------------- sections


@dataclass
class TargetSection:
    # A model directory, a hub repo id, or "eyas-demo" (the built-in tiny gpt-oss target,
    # built and cached on first use; it is then an ordinary model directory).
    model: str = "eyas-demo"
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N; the whole target there
    # Placement across devices, instead of `device` (data/target.py): auto | balanced | balanced_low_0 |
    # sequential (accelerate plans it from max_memory), or {module name: device} exactly, e.g.
    # {model.embed_tokens: 0, model.layers.0: 0, ..., model.layers.35: 1, model.norm: 1, lm_head: 1};
    # a device is a GPU index, cuda:N, cpu (kept in RAM, run on the first GPU) or disk
    device_map: str | dict[str, str] | None = None
    max_memory: dict[str, str] | None = None  # per device for a planned map, e.g. {0: 70GiB, 1: 70GiB, cpu: 200GiB}
    offload_folder: str | None = None  # where modules placed on "disk" keep their weights
    # How an MXFP4 checkpoint (gpt-oss) is held: auto (MXFP4 where transformers' kernels run: CUDA with
    # triton >= 3.4 and `kernels`; else dequantized to `dtype`, said in the log) | mxfp4 (fail otherwise) |
    # dequantized. Other checkpoints: auto.
    weights: str = "auto"
    trust_remote_code: bool = False


@dataclass
class PromptSource:
    """One entry of `data.prompts` in its list form: a data set and its share of the prompts."""

    source: str  # a local .jsonl/.json file or a hub dataset name ("org/name"), as data.prompts
    split: str = "train"  # hub datasets only
    hub_config: str | None = None  # hub datasets only
    # share of data.num_prompts: num_prompts * weight / (sum of weights), rounded so the shares add
    # up to num_prompts exactly; with num_prompts None every unique prompt is used and weights do not matter
    weight: float = 1.0
    name: str | None = None  # prefix of the prompt ids (name:record index); None = the file stem or dataset name

    def label(self) -> str:
        """`name`, else the file stem (a.jsonl -> a) or the hub dataset's name (org/ds -> ds)."""
        if self.name is not None:
            return self.name
        if self.source.endswith((".jsonl", ".json")):
            return Path(self.source).stem
        return self.source.rstrip("/").split("/")[-1]


@dataclass
class DataSection:
    # Local .jsonl/.json (ShareGPT `conversations` or OpenAI `messages` layout, or a bare
    # `prompt`/`question`/`instruction` field) or a hub dataset name ("org/name").
    # "eyas-demo/prompts.jsonl" is a file inside the built-in demo target's directory.
    # Or a list of sources mixed by weight and deduplicated across sources (data/prompts.py), e.g.
    # [{source: HuggingFaceH4/ultrachat_200k, split: train_sft, weight: 3}, {source: sharegpt.jsonl}]
    # (keys: PromptSource; split and hub_config then go in each source).
    prompts: str | list[PromptSource] = "eyas-demo/prompts.jsonl"
    split: str = "train"  # hub datasets only, the single-source form only
    hub_config: str | None = None  # hub datasets only, the single-source form only
    num_prompts: int | None = None  # None = all
    # user turns kept per conversation (None = all, 1 = only the first): the target answers each kept
    # user turn in order, with its own earlier answers in the context (the data set's answers are dropped)
    max_turns: int | None = None
    num_eval_prompts: int = 32  # held out before regeneration, never trained on
    system_prompt: str | None = None
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy regeneration
    top_p: float = 1.0
    batch_size: int = 32
    seed: int = 0
    # gpt-oss: each prompt's reasoning effort drawn from these weights (seeded by data.seed and the prompt
    # id) and passed to the chat template, which puts it in the system message; e.g. {low: 4, medium: 4,
    # high: 2} (SpecForge's mix). None: the template's default. The target's template must use it.
    reasoning_effort: dict[str, float] | None = None
    # hf: HF generate in this process (the target loaded as `target` says) | server: OpenAI-compatible
    # servers (vLLM, SGLang, eyas serve) at server_urls, prompts sent and answers kept as token ids
    # (data/server.py); e.g. [http://10.0.0.1:8000, http://10.0.0.2:8000] for a data-parallel fleet
    backend: str = "hf"
    server_urls: list[str] = field(default_factory=list)
    server_model: str | None = None  # the name the servers serve; None = the first of each's /v1/models
    server_concurrency: int = 64  # requests in flight per URL
    server_timeout_s: float = 600.0  # per request
    server_retries: int = 8  # per request, on connection errors, timeouts and 5xx, with exponential backoff


@dataclass
class CaptureSection:
    # vLLM convention: id k is the INPUT of decoder layer k (0-based) = HF hidden_states[k]; id N is the
    # OUTPUT of the last layer before the final norm (vLLM boundary numbering; not HF hidden_states[N]).
    # None = [2, N//2, N-3] for a target with N layers (gpt-oss-120b: [2, 18, 33]; nvidia's v3 draft: [24, 30, 36]).
    aux_layer_ids: list[int] | None = None
    dtype: str = "bfloat16"  # what the shards store (and the dtype compact aux states decode to)
    mode: str = "offline"  # offline (shards on disk) | online (the target runs inside training: train/online.py)
    aux_format: str = "same"  # same (dtype) | fp8 | int6 | int4: data/compact.py (bytes per token vs tau there)
    teacher: str = "final"  # final (the target's final state) | topk (its top-k next-token log-probs)
    teacher_topk: int = 32  # k for teacher: topk
    batch_size: int = 8
    shard_tokens: int = 262144  # tokens per safetensors shard
    verify_tolerance: float = 1e-3  # lm_head(final) vs target logits, relative to max |logit|


@dataclass
class VocabSection:
    draft_vocab_size: int = 32000  # clipped to nothing: must be <= target vocab


@dataclass
class DraftSection:
    intermediate_size: int | None = None  # None = the target's intermediate_size
    num_attention_heads: int | None = None  # None = the target's
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float | None = None
    init_from: str | None = None  # an eyas checkpoint to warm-start from
    # architecture options, each as vLLM's llama_eagle3.py runs it (train/model.py; which engines serve
    # which: serve/interchange/engines.py)
    norm_before_fc: bool = False  # one RMSNorm over the concatenated aux states before fc
    norm_before_residual: bool = False  # first layer: the residual is hidden_norm(h)
    num_layers: int = 1  # decoder layers


@dataclass
class TrainSection:
    ttt_steps: int = 7
    decay: float = 0.8
    loss: str = "kl"  # kl (forward KL, soft targets) | lk (-log sum min(p, q): acceptance at T=1) | ce (target argmax)
    epochs: float = 1.0
    max_steps: int | None = None  # overrides epochs when set
    batch_size: int = 4  # sequences per device per step
    grad_accum: int = 1
    max_length: int = 2048  # tokens per row; longer sequences are truncated
    # several sequences per row (document mask, per-sequence positions), so short sequences do
    # not waste a long row; batch_size then counts rows
    pack: bool = False
    # TTT attention (train/attention.py): auto (flex on CUDA, sdpa on CPU, else chunked) | flex |
    # sdpa (torch's flash CPU kernel) | chunked (all O(T) memory) | dense (the (T x T) reference,
    # short sequences only)
    attention: str = "auto"
    # recompute each TTT step's decoder layer in backward: about a third more compute, a fraction of
    # the activation memory (gpt-oss-120b dims on 80 GB: T = 32K without, more with; see the README)
    checkpoint_layer: bool = False
    # torch.compile the draft's norms and MLP (Eagle3Draft.compile_math): fused elementwise math and
    # fewer saved activations. auto: on CUDA, except under DeepSpeed ZeRO-3 (its hooks gather weights
    # per submodule, outside what a compiled graph sees) | on | off
    compile: str = "auto"
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.1
    grad_clip: float = 0.5
    mixed_precision: str = "auto"  # auto (bf16 on GPUs that support it, else no) | no | bf16 | fp16
    log_every: int = 10
    save_every: int = 0  # 0 = only at the end
    # captured sequences held out from training; TTT acceptance and the simulated tau for every
    # k <= ttt_steps are measured on them every val_every steps (0: only at the end) and at the end
    val_fraction: float = 0.02
    val_every: int = 0
    report_to: str = "none"  # none | wandb | tensorboard | trackio (accelerate's trackers)
    seed: int = 0
    num_workers: int = 0


@dataclass
class EvalSection:
    k: int = 4  # chain length (draft tokens per verification): the report's headline shape
    more_k: list[int] = field(default_factory=list)  # more chain lengths evaluated next to k
    # EAGLE-2 dynamic trees as "STEPS,TOPK,NUM_DRAFT_TOKENS" (SGLang's parameters), evaluated next to k
    tree: list[str] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=lambda: [1])  # requests held in flight
    temperature: list[float] = field(default_factory=lambda: [0.0])  # 0 = greedy (checked lossless)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0  # request i samples with seed + i
    max_new_tokens: int = 256
    num_prompts: int | None = None  # None = every held-out prompt
    check_lossless: bool = True


@dataclass
class Recipe:
    name: str = "eyas"
    target: TargetSection = field(default_factory=TargetSection)
    data: DataSection = field(default_factory=DataSection)
    capture: CaptureSection = field(default_factory=CaptureSection)
    vocab: VocabSection = field(default_factory=VocabSection)
    draft: DraftSection = field(default_factory=DraftSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- parsing


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _fits(value: Any, tp: Any) -> bool:
    """Whether `value` has the outer shape of `tp` (a list for list[...], a mapping for a dict or a
    dataclass, ...): the one union member whose errors name the exact item."""
    origin = typing.get_origin(tp) or tp
    if origin is dict or dataclasses.is_dataclass(tp):
        return isinstance(value, dict)
    if origin in (list, str, bool):
        return isinstance(value, origin)
    if origin in (int, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it (ints are accepted for floats).
    A dataclass `tp` (a list item, a union member) is built from a mapping by `_build`."""
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise RecipeError(f"{key}: expected a mapping ({', '.join(f.name for f in dataclasses.fields(tp))}), "
                              f"got {value!r}")
        return _build(tp, value, key)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        real = [a for a in args if a is not type(None)]
        fitting = [a for a in real if _fits(value, a)]
        if len(real) == 1 or len(fitting) == 1:  # that member's own error, which names the exact item
            return _coerce(value, (fitting or real)[0], key)
        for arg in real:
            try:
                return _coerce(value, arg, key)
            except RecipeError:
                pass
        raise RecipeError(f"{key}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is dict:
        _, item_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise RecipeError(f"{key}: expected a mapping, got {value!r}")
        out = {}
        for k, v in value.items():  # keys are names: YAML reads `0:` (a GPU index) as an int
            if item_tp is str and isinstance(v, int) and not isinstance(v, bool):
                v = str(v)  # a GPU index as a value
            out[str(k)] = _coerce(v, item_tp, f"{key}.{k}")
        return out
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise RecipeError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads `3e-4` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise RecipeError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"{key}: expected a string, got {value!r}")
        return value
    raise RecipeError(f"{key}: unsupported type {tp}")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{prefix or 'recipe'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in names:
            where = f"{prefix}.{k}" if prefix else str(k)
            raise RecipeError(f"{where}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if f.name not in raw:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            _check(not required, key, "required (no default)")
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, raw[f.name], key)
        else:
            kwargs[f.name] = _coerce(raw[f.name], tp, key)
    return cls(**kwargs)


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise RecipeError(f"{key}: {msg}")


DEVICE_MAP_PLANS = ("auto", "balanced", "balanced_low_0", "sequential")


def _check_placement(r: Recipe) -> None:
    t = r.target
    _check(t.weights in ("auto", "mxfp4", "dequantized"), "target.weights",
           f"must be auto, mxfp4 or dequantized, got {t.weights!r}")
    if isinstance(t.device_map, str):
        _check(t.device_map in DEVICE_MAP_PLANS, "target.device_map",
               f"must be one of {', '.join(DEVICE_MAP_PLANS)} or a mapping of module names to devices, "
               f"got {t.device_map!r}")
    if isinstance(t.device_map, dict):
        _check(len(t.device_map) > 0, "target.device_map", "an explicit map must place at least one module")
        for name, dev in t.device_map.items():
            _check(dev.isdigit() or dev in ("cpu", "disk") or (dev.startswith("cuda:") and dev[5:].isdigit()),
                   f"target.device_map.{name}", f"must be a GPU index, cuda:N, cpu or disk, got {dev!r}")
        _check(t.max_memory is None, "target.max_memory", "applies to a planned device_map (auto, balanced…), "
               "not to an explicit one")
        _check("disk" not in t.device_map.values() or t.offload_folder, "target.offload_folder",
               "must be set when target.device_map places modules on disk")
    _check(t.max_memory is None or t.device_map is not None, "target.max_memory",
           "needs target.device_map (auto, balanced, balanced_low_0 or sequential)")
    _check(t.device_map is None or t.device == "auto", "target.device",
           "leave it at auto when target.device_map places the target")
    _check(t.device_map is None or r.capture.mode == "offline", "target.device_map",
           "capture.mode online runs a whole target on each training process's device; leave the map unset")


def _check_prompt_sources(d: DataSection) -> None:
    _check(bool(d.prompts), "data.prompts", "list at least one source, or give one file or dataset name")
    if isinstance(d.prompts, str):
        return
    _check(d.split == "train", "data.split", "with a list of data.prompts, put split in each source "
           f"(data.prompts[i].split), not here (got {d.split!r})")
    _check(d.hub_config is None, "data.hub_config", "with a list of data.prompts, put hub_config in each "
           f"source (data.prompts[i].hub_config), not here (got {d.hub_config!r})")
    labels: dict[str, int] = {}
    for i, s in enumerate(d.prompts):
        key = f"data.prompts[{i}]"
        _check(bool(s.source.strip()), f"{key}.source", "must name a .jsonl/.json file or a hub dataset")
        _check(s.weight > 0, f"{key}.weight", f"must be > 0, got {s.weight}")
        label = s.label()
        _check(bool(label) and ":" not in label, f"{key}.name",
               f"must be non-empty and without ':' (it prefixes the prompt ids name:index), got {label!r}")
        if label in labels:
            j = labels[label]
            raise RecipeError(f"{key}.name: data.prompts[{j}] ({d.prompts[j].source}) and data.prompts[{i}] "
                              f"({s.source}) are both named {label!r}; give one a distinct name")
        labels[label] = i


def validate(r: Recipe) -> Recipe:
    """Value checks that need no model. Raises RecipeError naming the key."""
    _check(r.target.dtype in ("auto", "float32", "bfloat16", "float16"), "target.dtype",
           f"must be auto, float32, bfloat16 or float16, got {r.target.dtype!r}")
    _check_placement(r)
    _check_prompt_sources(r.data)
    _check(r.data.max_turns is None or r.data.max_turns >= 1, "data.max_turns",
           f"must be >= 1 (1: only the first user turn) or null (all), got {r.data.max_turns}")
    _check(r.data.num_eval_prompts >= 0, "data.num_eval_prompts", "must be >= 0")
    _check(r.data.num_prompts is None or r.data.num_prompts > 0, "data.num_prompts", "must be > 0")
    _check(r.data.max_new_tokens >= 1, "data.max_new_tokens", "must be >= 1")
    _check(r.data.temperature >= 0, "data.temperature", "must be >= 0")
    _check(0 < r.data.top_p <= 1, "data.top_p", "must be in (0, 1]")
    _check(r.data.batch_size >= 1, "data.batch_size", "must be >= 1")
    for level, w in (r.data.reasoning_effort or {}).items():
        _check(level in ("low", "medium", "high"), f"data.reasoning_effort.{level}",
               "levels are low, medium and high")
        _check(w > 0, f"data.reasoning_effort.{level}", f"a weight must be > 0, got {w}")
    _check(r.data.reasoning_effort is None or len(r.data.reasoning_effort) > 0, "data.reasoning_effort",
           "name at least one level, or leave it unset")
    _check(r.data.backend in ("hf", "server"), "data.backend", f"must be hf or server, got {r.data.backend!r}")
    _check(r.data.backend != "server" or len(r.data.server_urls) > 0, "data.server_urls",
           "data.backend: server needs at least one URL (e.g. http://127.0.0.1:8000)")
    for i, u in enumerate(r.data.server_urls):
        _check(u.startswith(("http://", "https://")), f"data.server_urls[{i}]", f"must start with http://, got {u!r}")
    _check(r.data.server_concurrency >= 1, "data.server_concurrency", "must be >= 1")
    _check(r.data.server_retries >= 0, "data.server_retries", "must be >= 0")
    if r.capture.aux_layer_ids is not None:
        ids = r.capture.aux_layer_ids
        _check(len(ids) >= 1, "capture.aux_layer_ids", "must name at least one layer")
        _check(all(i >= 0 for i in ids), "capture.aux_layer_ids", f"ids must be >= 0, got {ids}")
        _check(len(set(ids)) == len(ids), "capture.aux_layer_ids", f"ids must be distinct, got {ids}")
    _check(r.capture.dtype in ("float32", "bfloat16", "float16"), "capture.dtype",
           f"must be float32, bfloat16 or float16, got {r.capture.dtype!r}")
    _check(r.capture.aux_format in ("same", "fp8", "int6", "int4"), "capture.aux_format",
           f"must be same, fp8, int6 or int4, got {r.capture.aux_format!r}")
    _check(r.capture.teacher in ("final", "topk"), "capture.teacher",
           f"must be final or topk, got {r.capture.teacher!r}")
    _check(r.capture.mode in ("offline", "online"), "capture.mode", f"must be offline or online, got {r.capture.mode!r}")
    _check(r.capture.mode == "offline" or (r.capture.aux_format, r.capture.teacher) == ("same", "final"),
           "capture.mode", "online stores nothing: leave capture.aux_format (same) and capture.teacher (final) "
           "at their defaults")
    _check(r.capture.teacher_topk >= 1, "capture.teacher_topk", f"must be >= 1, got {r.capture.teacher_topk}")
    _check(r.capture.batch_size >= 1, "capture.batch_size", "must be >= 1")
    _check(r.capture.shard_tokens >= 1, "capture.shard_tokens", "must be >= 1")
    _check(r.vocab.draft_vocab_size >= 1, "vocab.draft_vocab_size", "must be >= 1")
    for name in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        v = getattr(r.draft, name)
        _check(v is None or v >= 1, f"draft.{name}", "must be >= 1")
    _check(r.draft.num_layers >= 1, "draft.num_layers", f"must be >= 1, got {r.draft.num_layers}")
    _check(r.train.loss in ("kl", "lk", "ce"), "train.loss", f"must be kl, lk or ce, got {r.train.loss!r}")
    _check(r.train.ttt_steps >= 1, "train.ttt_steps", "must be >= 1")
    _check(0 < r.train.decay <= 1, "train.decay", "must be in (0, 1]")
    _check(r.train.epochs > 0, "train.epochs", "must be > 0")
    _check(r.train.max_steps is None or r.train.max_steps >= 1, "train.max_steps", "must be >= 1")
    _check(r.train.batch_size >= 1, "train.batch_size", "must be >= 1")
    _check(r.train.grad_accum >= 1, "train.grad_accum", "must be >= 1")
    _check(r.train.max_length >= 2, "train.max_length", "must be >= 2")
    _check(0 <= r.train.val_fraction < 1, "train.val_fraction", "must be in [0, 1)")
    _check(r.train.val_every >= 0, "train.val_every", "must be >= 0 (0: validate only at the end)")
    _check(r.train.report_to in ("none", "wandb", "tensorboard", "trackio"), "train.report_to",
           f"must be none, wandb, tensorboard or trackio, got {r.train.report_to!r}")
    _check(r.train.attention in ("auto", "flex", "sdpa", "chunked", "dense"), "train.attention",
           f"must be auto, flex, sdpa, chunked or dense, got {r.train.attention!r}")
    _check(r.train.compile in ("auto", "on", "off"), "train.compile",
           f"must be auto, on or off, got {r.train.compile!r}")
    _check(r.train.lr > 0, "train.lr", "must be > 0")
    _check(0 <= r.train.warmup_ratio < 1, "train.warmup_ratio", "must be in [0, 1)")
    _check(0 <= r.train.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]")
    _check(r.train.grad_clip >= 0, "train.grad_clip", "must be >= 0")
    _check(r.train.mixed_precision in ("auto", "no", "bf16", "fp16"), "train.mixed_precision",
           f"must be auto, no, bf16 or fp16, got {r.train.mixed_precision!r}")
    _check(r.eval.k >= 1, "eval.k", f"must be >= 1, got {r.eval.k}")
    _check(r.eval.k <= r.train.ttt_steps, "eval.k",
           f"k={r.eval.k} drafts past what TTT trained (train.ttt_steps={r.train.ttt_steps})")
    for i, k in enumerate(r.eval.more_k):
        _check(1 <= k <= r.train.ttt_steps, f"eval.more_k[{i}]",
               f"k={k} must be in 1..train.ttt_steps={r.train.ttt_steps}")
    _check(r.eval.max_new_tokens >= 1, "eval.max_new_tokens", "must be >= 1")
    _check(len(r.eval.concurrency) >= 1 and all(c >= 1 for c in r.eval.concurrency), "eval.concurrency",
           f"must list levels >= 1, got {r.eval.concurrency}")
    _check(len(r.eval.temperature) >= 1 and all(t >= 0 for t in r.eval.temperature), "eval.temperature",
           f"must list temperatures >= 0, got {r.eval.temperature}")
    _check(0 < r.eval.top_p <= 1, "eval.top_p", "must be in (0, 1]")
    _check(r.eval.top_k >= -1, "eval.top_k", "must be -1 or 0 (off) or >= 1")
    for i, t in enumerate(r.eval.tree):
        from eyas.serve.decoding.tree import TreeShape

        try:
            shape = TreeShape.parse(t)
        except ValueError as e:
            raise RecipeError(f"eval.tree[{i}]: {e}") from None
        _check(shape.steps <= r.train.ttt_steps, f"eval.tree[{i}]",
               f"{shape.steps} steps draft past what TTT trained (train.ttt_steps={r.train.ttt_steps})")
    return r


def check_against_target(r: Recipe, num_layers: int, vocab_size: int) -> list[int]:
    """Checks that need the target config; returns the resolved aux layer ids (vLLM convention)."""
    ids = r.capture.aux_layer_ids if r.capture.aux_layer_ids is not None else default_aux_layer_ids(num_layers)
    for i in ids:
        _check(i <= num_layers, "capture.aux_layer_ids",
               f"layer id {i} > the target's {num_layers} layers (vLLM convention: id k is the input of decoder "
               f"layer k, id {num_layers} the output of the last layer before the final norm: ids run "
               f"0..{num_layers})")
    _check(r.vocab.draft_vocab_size <= vocab_size, "vocab.draft_vocab_size",
           f"{r.vocab.draft_vocab_size} > the target's vocab size {vocab_size}")
    return list(ids)


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux layers: inputs of layers [2, N//2, N-3]."""
    if num_layers >= 6:
        return [2, num_layers // 2, num_layers - 3]
    # tiny targets: three distinct ids where possible (vLLM and SGLang build fc for exactly 3),
    # never 0 (the embeddings; engines number from the output of layer 0)
    return sorted({min(i, num_layers - 1) for i in (1, max(num_layers // 2, 1), num_layers - 1)})


# --------------------------------------------------------------------------- loading


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`train.lr=3e-4 eval.k=5` -> nested dict; values are parsed as YAML scalars/lists."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise RecipeError(f"override {pair!r}: expected key.sub=value")
        key, value = pair.split("=", 1)
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise RecipeError(f"override {key}: {p} is not a section")
        node[parts[-1]] = yaml.safe_load(value) if value != "" else None
    return out


def _merge(base: dict, over: dict) -> dict:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def builtin_recipe_path(name: str) -> Path | None:
    """`demo` or `demo.yaml` -> the recipe shipped inside eyas.recipes."""
    p = Path(__file__).parent / (name if name.endswith(".yaml") else f"{name}.yaml")
    return p if p.is_file() else None


def load_recipe(source: str | Path | dict | None, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe file (or a shipped recipe name, or a dict), apply dotted overrides, validate."""
    if source is None:
        raw: dict = {}
    elif isinstance(source, dict):
        raw = source
    else:
        path = Path(source)
        if not path.is_file():
            shipped = builtin_recipe_path(str(source))
            if shipped is None:
                raise RecipeError(f"recipe {source}: no such file")
            path = shipped
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise RecipeError(f"recipe {path}: not valid YAML: {e}") from e
    raw = _merge(raw, parse_overrides(overrides or []))
    return validate(_build(Recipe, raw, ""))


def dump_recipe(r: Recipe) -> str:
    return yaml.safe_dump(r.to_dict(), sort_keys=False)
