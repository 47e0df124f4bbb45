"""What a recipe is: one strict pydantic model per YAML section; a field's description documents its key
(`eyas recipe-keys` prints them). Types, ranges and choices sit on the fields (value types in
recipes/types.py), checks across keys in `model_validator`s. Every error is one line naming its dotted key
(`train.lr`, `capture.aux_layer_ids[1]`): recipes/load.py reads YAML and overrides into these models, words
pydantic's errors so, and checks a recipe against its target's config.json.
"""

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from eyas.infra.errors import InputError
from eyas.recipes.defaults import ATTENTION_BLOCK_MB, PREFILL_TOKENS
from eyas.recipes.draft import SECTIONS, AnyDraftSection
from eyas.recipes.types import DeviceMap, Dtype, Names, Num, Section, TreeShape, Weights, either
from eyas.train.kinds import DEFAULT_KIND, foreign_options, kind_named

DEVICE_MAP_PLANS = ("auto", "balanced", "balanced_low_0", "sequential")
Attention = Literal["auto", "flex", "sdpa", "chunked", "dense"]
Precision = Literal["auto", "no", "bf16", "fp16"]
AuxFormat = Literal["same", "fp8", "int6", "int4"]


class RecipeError(InputError, ValueError):
    """A recipe key is unknown, has the wrong type or an impossible value."""


def check(cond: Any, key: str, msg: str) -> None:
    if not cond:
        raise RecipeError(f"{key}: {msg}")


class TargetSection(Section):
    model: str = Field(
        "eyas-demo",
        description="a model directory or hub id, a .gguf file, eyas-demo, smollm2-135m-instruct (packaged)",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="auto: checkpoint's")
    device: str = Field("auto", description="the whole target on auto (cuda if any, else cpu), cpu or cuda:N")
    device_map: DeviceMap | None = Field(None, description="a plan (auto, balanced…) or {module: device}")
    max_memory: Names | None = Field(None, description="per device, for a plan: {0: 70GiB, cpu: 200GiB}")
    offload_folder: str | None = Field(None, description="where modules placed on disk keep their weights")
    weights: Literal["auto", "mxfp4", "dequantized"] = Field("auto", description="auto: MXFP4 where it runs")
    trust_remote_code: bool = Field(False, description="let transformers run the checkpoint's own code")

    @model_validator(mode="after")
    def _placement(self) -> "TargetSection":
        m, key, explicit = self.device_map, "target.device_map", isinstance(self.device_map, dict)
        plans = ", ".join(DEVICE_MAP_PLANS)
        why = f"must be one of {plans} or a mapping of module names to devices, got {m!r}"
        check(explicit or m is None or m in DEVICE_MAP_PLANS, key, why)
        check(m != {}, key, "an explicit map must place at least one module")
        for name, d in m.items() if explicit else ():
            ok = d.isdigit() or d in ("cpu", "disk") or (d.startswith("cuda:") and d[5:].isdigit())
            check(ok, f"{key}.{name}", f"must be a GPU index, cuda:N, cpu or disk, got {d!r}")
        why = "applies to a planned device_map (auto, balanced…), not to an explicit one"
        check(not explicit or self.max_memory is None, "target.max_memory", why)
        why = "must be set when target.device_map places modules on disk"
        check(not explicit or "disk" not in m.values() or self.offload_folder, "target.offload_folder", why)
        why = "needs target.device_map (auto, balanced, balanced_low_0 or sequential)"
        check(self.max_memory is None or m is not None, "target.max_memory", why)
        why = "leave it at auto when target.device_map places the target"
        check(m is None or self.device == "auto", "target.device", why)
        return self


class PromptSource(Section):
    """One entry of `data.prompts` in its list form: a data set and its share of the prompts."""

    source: str = Field(description="a local .jsonl/.json file or a hub dataset name (org/name)")
    split: str = Field("train", description="the split (hub datasets only)")
    hub_config: str | None = Field(None, description="the dataset's config (hub datasets only)")
    weight: Num = Field(1.0, gt=0, description="share of data.num_prompts: weight / the sum of the weights")
    name: str | None = Field(None, description="prefix of the prompt ids (name:index); null: file or dataset")

    def __init__(self, source: str | None = None, /, **kw: Any) -> None:  # PromptSource("a.jsonl") too
        super().__init__(**kw if source is None else {"source": source, **kw})

    def label(self) -> str:
        """`name`, else the file stem (a.jsonl -> a) or the hub dataset's name (org/ds -> ds)."""
        if self.name is not None:
            return self.name
        s = self.source
        return Path(s).stem if s.endswith((".jsonl", ".json")) else s.rstrip("/").split("/")[-1]


Prompts = either(str, list[PromptSource], "str or list")


class DataSection(Section):
    prompts: Prompts = Field("eyas-demo/prompts.jsonl", description="a file, a hub dataset, or sources mixed")
    split: str = Field("train", description="the split (one hub dataset only)")
    hub_config: str | None = Field(None, description="the dataset's config (one hub dataset only)")
    num_prompts: int | None = Field(None, gt=0, description="prompts used (null: all)")
    max_turns: int | None = Field(None, ge=1, description="user turns answered per conversation (null: all)")
    num_eval_prompts: int = Field(32, ge=0, description="held out before regeneration, never trained on")
    system_prompt: str | None = Field(None, description="a system message put before every prompt")
    max_prompt_tokens: int = Field(1024, description="longer rendered prompts are skipped")
    max_new_tokens: int = Field(256, ge=1, description="the target's answer to each turn, at most")
    temperature: Num = Field(0.0, ge=0, description="regeneration's sampling temperature (0: greedy)")
    top_p: Num = Field(1.0, gt=0, le=1, description="regeneration's nucleus sampling")
    batch_size: int = Field(32, ge=1, description="prompts generated together (backend hf)")
    seed: int = Field(0, description="seeds sampling, the held-out split and the reasoning efforts")
    reasoning_effort: Weights | None = Field(None, description="gpt-oss: efforts by weight {low: 4, high: 2}")
    backend: Literal["hf", "server", "vllm"] = Field(
        "hf",
        description="generate in this process, ask server_urls, or a vLLM server eyas starts (install-vllm)",
    )
    server_urls: list[str] = Field([], description="OpenAI-compatible servers (vLLM, SGLang, eyas serve)")
    server_model: str | None = Field(None, description="the name the servers serve (null: each one's first)")
    server_concurrency: int = Field(64, ge=1, description="requests in flight per URL")
    server_timeout_s: Num = Field(
        600.0,
        gt=0,
        description="seconds a server may answer nothing (no request back, its /health, asked every 2 s, "
        "failing or 5xx) before the stage stops naming it; a request has no limit of its own (a long prompt "
        "may queue for minutes)",
    )
    server_stall_s: Num = Field(
        14400.0,
        gt=0,
        description="seconds a server may hold requests without finishing any (a hung engine whose /health "
        "still answers) before the stage stops naming it",
    )
    server_retries: int = Field(
        8, ge=0, description="per request, on connection errors (a connect timeout included) and 5xx"
    )

    @model_validator(mode="after")
    def _sources(self) -> "DataSection":
        check(self.prompts, "data.prompts", "list at least one source, or give one file or dataset name")
        sources = self.prompts if isinstance(self.prompts, list) else []
        for k in ("split", "hub_config") if sources else ():
            got = getattr(self, k)
            why = f"with a list of data.prompts, put {k} in each source (data.prompts[i].{k}), not here"
            check(got == DataSection.model_fields[k].default, f"data.{k}", f"{why} (got {got!r})")
        labels: dict[str, int] = {}
        for i, s in enumerate(sources):
            key, label = f"data.prompts[{i}]", s.label()
            check(s.source.strip(), f"{key}.source", "must name a .jsonl/.json file or a hub dataset")
            why = f"must be non-empty and without ':' (it prefixes the prompt ids name:index), got {label!r}"
            check(label and ":" not in label, f"{key}.name", why)
            j = labels.setdefault(label, i)
            both = f"data.prompts[{j}] ({sources[j].source}) and data.prompts[{i}] ({s.source})"
            check(j == i, f"{key}.name", f"{both} are both named {label!r}; give one a distinct name")
        for level, w in (self.reasoning_effort or {}).items():
            key = f"data.reasoning_effort.{level}"
            check(level in ("low", "medium", "high"), key, "levels are low, medium and high")
            check(w > 0, key, f"a weight must be > 0, got {w}")
        why = "name at least one level, or leave it unset"
        check(self.reasoning_effort != {}, "data.reasoning_effort", why)
        why = "data.backend: server needs at least one URL (e.g. http://127.0.0.1:8000)"
        check(self.backend != "server" or self.server_urls, "data.server_urls", why)
        for i, u in enumerate(self.server_urls):
            ok = u.startswith(("http://", "https://"))
            check(ok, f"data.server_urls[{i}]", f"must start with http://, got {u!r}")
        return self


class CaptureSection(Section):
    aux_layer_ids: list[int] | None = Field(None, description="vLLM layer ids; null: [2, N//2, N-3]")
    dtype: Dtype = Field("bfloat16", description="what the shards store")
    mode: Literal["offline", "online"] = Field(
        "offline", description="shards on disk, or states made during training (by its backend)"
    )
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="whose forward: transformers', or vLLM's (extract_hidden_states; eyas install-vllm)"
    )
    aux_format: AuxFormat = Field("same", description="aux states stored as capture.dtype (same), or compact")
    teacher: Literal["final", "topk"] = Field("final", description="target's final state, or top-k logprobs")
    teacher_topk: int = Field(32, ge=1, description="k for teacher: topk")
    batch_size: int = Field(8, ge=1, description="sequences through the target together")
    online_prefetch: int = Field(
        4, ge=1, description="online from vLLM: micro-batches each trainer asks for ahead (the buffer)"
    )
    shard_tokens: int = Field(262144, ge=1, description="tokens per safetensors shard")
    verify_tolerance: Num = Field(1e-3, description="lm_head(final) vs the target's logits, over max |logit|")

    @model_validator(mode="after")
    def _ids(self) -> "CaptureSection":
        ids, key = self.aux_layer_ids, "capture.aux_layer_ids"
        check(ids != [], key, "must name at least one layer")
        check(min(ids or [0]) >= 0, key, f"ids must be >= 0, got {ids}")
        check(len(set(ids or [])) == len(ids or []), key, f"ids must be distinct, got {ids}")
        stores = (self.aux_format, self.teacher) != ("same", "final")
        why = "online stores nothing: leave capture.aux_format (same) and capture.teacher (final) at their "
        why += "defaults"
        check(self.mode == "offline" or not stores, "capture.mode", why)
        return self


class VllmSection(Section):
    """Where vLLM runs for `data.backend: vllm` and `capture.backend: vllm`: replicas of the target, each over
    `tensor_parallel_size` devices, eyas starting, health-checking and stopping every one."""

    devices: list[int] | None = Field(
        None,
        description="GPU indices as nvidia-smi numbers them (null: every visible GPU); on a machine "
        "without GPUs, CPU core ids",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="devices per replica (vLLM --tensor-parallel-size)"
    )
    replicas: int | None = Field(
        None, ge=1, description="engines over the devices (null: devices // tensor_parallel_size; CPU: 1)"
    )
    gpu_memory_utilization: Num = Field(0.9, gt=0, le=1, description="vLLM's share of each GPU's memory")
    max_model_len: int | None = Field(
        None, ge=16, description="vLLM's context length (null: what the stage needs, at most the target's)"
    )
    max_num_seqs: int | None = Field(None, ge=1, description="sequences per engine step (null: vLLM's)")
    extra_args: list[str] = Field([], description="more `vllm serve` arguments, passed as they are")
    enforce_eager: bool | None = Field(
        None,
        description="vLLM --enforce-eager: no CUDA graphs (null: CUDA graphs on a GPU, eager on a CPU, where "
        "vLLM's CPU build would compile its forward with torch.compile instead)",
    )

    @model_validator(mode="after")
    def _devices(self) -> "VllmSection":
        d, tp = self.devices, self.tensor_parallel_size
        check(d != [], "vllm.devices", "list at least one device, or leave it null (every visible GPU)")
        check(len(set(d or [])) == len(d or []), "vllm.devices", f"devices must be distinct, got {d}")
        check(min(d or [0]) >= 0, "vllm.devices", f"device indices must be >= 0, got {d}")
        need = (self.replicas or 1) * tp
        why = f"{self.replicas or 1} replica(s) x vllm.tensor_parallel_size {tp} need {need} devices"
        check(d is None or len(d) >= need, "vllm.devices", f"{why}, it lists {len(d or [])}: {d}")
        return self


class VocabSection(Section):
    draft_vocab_size: int = Field(32000, ge=1, description="the draft's vocabulary (at most the target's)")


class TrainSection(Section):
    ttt_steps: int = Field(7, ge=1, description="training-time-test steps: draft tokens unrolled")
    decay: Num = Field(0.8, gt=0, le=1, description="step i's loss is weighed by decay**i")
    loss: Literal["kl", "lk", "ce"] = Field("kl", description="KL; -log sum min(p, q); CE on the argmax")
    epochs: Num = Field(1.0, gt=0, description="passes over the captured data")
    max_steps: int | None = Field(None, ge=1, description="overrides epochs when set")
    batch_size: int = Field(4, ge=1, description="rows per device per step")
    grad_accum: int = Field(1, ge=1, description="gradient accumulation steps")
    max_length: int = Field(2048, ge=2, description="tokens per row; longer sequences are truncated")
    pack: bool = Field(False, description="several sequences per row (document mask, per-sequence positions)")
    pack_length: int | None = Field(
        None,
        ge=2,
        description="with pack: rows filled up to this many tokens, a longer sequence (up to max_length) in "
        "a row of its own; long sequences train whole while the short ones keep the optimizer steps of short "
        "rows (null: max_length)",
    )
    sequence_parallel: int = Field(
        1,
        ge=1,
        description="processes one row is spread over (train/sequence_parallel.py; EAGLE-3 and P-EAGLE: "
        "Ulysses, it divides the draft's query and key/value heads; DFlash: the row's context gathered on "
        "each) and it divides the process count (P x D processes: D rows at a time)",
    )
    cod_ratio: Num = Field(
        0.7,
        gt=0,
        le=1,
        description="draft.kind peagle: depth d trains on a random max(cod_ratio**d, cod_floor) of the "
        "positions (COD sampling, nested; speculators' default 0.7); 1: every position",
    )
    cod_floor: Num = Field(0.2, gt=0, le=1, description="draft.kind peagle: the share no depth goes below")
    block_weight: Literal["decay", "dpace"] = Field(
        "dpace",
        description="draft.kind dflash: each draft's weight in its block's loss: decay**d (the DFlash "
        "paper's exp(-d / gamma)), or D-PACE's expected accepted run it starts (speculators 0.9.0's default; "
        "train/kinds/dflash/core.py dpace_weights)",
    )
    dpace_alpha: Num = Field(0.5, gt=0, le=1, description="block_weight dpace: the confidences' smoothing")
    block_lengths: Literal["full", "random"] = Field(
        "full",
        description="draft.kind dflash: full trains whole blocks, so a checkpoint serves k = block_size - 1 "
        "only (a shorter block's slots see fewer mask slots than in training; refused); random draws each "
        "training block's drafts uniformly in 1 .. block_size - 1 (its later slots neither seen nor scored), "
        "so every k up to block_size - 1 is a trained shape (validation runs whole blocks)",
    )
    max_anchors: int = Field(
        512,
        ge=1,
        description="draft.kind dflash: blocks drawn at random anchors per row each step (speculators' "
        "default 512; validation runs one at every position)",
    )
    attention: Attention = Field("auto", description="TTT attention")
    checkpoint_layer: bool = Field(False, description="recompute each step's layer in backward: less memory")
    compile: Literal["auto", "on", "off"] = Field("auto", description="torch.compile the norms and MLP")
    lr: Num = Field(1e-4, gt=0, description="peak learning rate")
    weight_decay: Num = Field(0.0, description="AdamW weight decay")
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw", description="muon: Muon on fc and the layers' matrices, AdamW on the rest (speculators')"
    )
    muon_weight_decay: Num = Field(0.1, ge=0, description="Muon's weight decay (train.optimizer: muon)")
    warmup_ratio: Num = Field(0.03, ge=0, lt=1, description="share of the steps warming up")
    min_lr_ratio: Num = Field(0.1, ge=0, le=1, description="the last learning rate, as a share of lr")
    grad_clip: Num = Field(0.5, ge=0, description="max gradient norm")
    mixed_precision: Precision = Field("auto", description="auto: bf16 if it runs")
    log_every: int = Field(10, description="steps between log lines")
    save_every: int = Field(0, description="steps between checkpoints (0: only at the end)")
    val_fraction: Num = Field(
        0.02, ge=0, lt=1, description="conversations held out whole for validation: the tuning split"
    )
    val_every: int = Field(0, ge=0, description="steps between validations (0: only at the end)")
    keep_best: bool = Field(
        False,
        description="keep, beside the final draft, the one whose validation (every val_every steps and the "
        "last) had the highest tuning-split tau at eval.k (replayed on greedy text: the greedy loop's; else "
        "simulated at T = 1) as train/checkpoint-best, the run's draft for eval, serve and export",
    )
    report_to: Literal["none", "wandb", "tensorboard", "trackio"] = Field("none", description="a tracker")
    seed: int = Field(0, description="seeds initialisation, data order and the held-out split")
    val_seed: int | None = Field(
        None, description="seeds the held-out split instead of `seed` (seeds compared on the same sequences)"
    )
    num_workers: int = Field(0, description="data loader workers")


class EvalSection(Section):
    k: int = Field(
        4,
        ge=1,
        description="chain length (draft tokens per verification): the headline shape (DFlash: "
        "its block's drafts, block_size - 1, by default)",
    )
    more_k: list[int] = Field([], description="more chain lengths evaluated next to k")
    tree: list[str] = Field([], description="EAGLE-2 dynamic trees as STEPS,TOPK,NUM_DRAFT_TOKENS (SGLang's)")
    concurrency: list[int] = Field([1], description="requests held in flight, one run each")
    temperature: list[Num] = Field([0.0], description="sampling temperatures, one run each (0: greedy)")
    top_p: Num = Field(1.0, gt=0, le=1, description="nucleus sampling")
    top_k: int = Field(0, ge=-1, description="top-k sampling (-1 or 0: off)")
    seed: int = Field(0, description="request i samples with seed + i")
    max_new_tokens: int = Field(256, ge=1, description="tokens generated per request")
    num_prompts: int | None = Field(None, description="prompts evaluated per set (null: all), spread evenly")
    benchmarks: dict[str, str] = Field(
        {}, description="prompt sets {name: file or mt-bench / humaneval / gsm8k}; {}: the held-out prompts"
    )
    target_dtype: Dtype | None = Field(
        None, description="the target's dtype in the loop (null: target.dtype); float32: exact lossless check"
    )
    prefill_tokens: int = Field(
        PREFILL_TOKENS,
        ge=16,
        description="tokens per target forward when prompts are prefilled: a longer prompt goes in chunks "
        "(the loop, the greedy references and the verdict alike)",
    )
    attention_block_mb: int = Field(
        ATTENTION_BLOCK_MB,
        ge=1,
        description="MiB of attention scores per block of query rows, where the target's attention is eager "
        "(gpt-oss, for its sinks: train/blocked_attention.py)",
    )
    check_lossless: bool = Field(
        True,
        description="at temperature 0, check every output against the target's plain greedy output (false: "
        "no references computed, the report says not checked)",
    )

    @model_validator(mode="after")
    def _levels(self) -> "EvalSection":
        c, t = self.concurrency, self.temperature
        check(c and min(c) >= 1, "eval.concurrency", f"must list levels >= 1, got {c}")
        check(t and min(t) >= 0, "eval.temperature", f"must list temperatures >= 0, got {t}")
        return self


class Recipe(Section):
    name: str = Field("eyas", description="the run's name (runs/<name> by default)")
    target: TargetSection = Field(default_factory=TargetSection, description="the target and where it runs")
    data: DataSection = Field(default_factory=DataSection, description="prompts and the target's answers")
    capture: CaptureSection = Field(default_factory=CaptureSection, description="the states trained on")
    vllm: VllmSection = Field(default_factory=VllmSection, description="vLLM's replicas (backend: vllm)")
    vocab: VocabSection = Field(default_factory=VocabSection, description="the draft's vocabulary")
    draft: AnyDraftSection = Field(  # one class a kind, picked by draft.kind (recipes/draft.py)
        default_factory=lambda: SECTIONS[DEFAULT_KIND](), description="the draft's architecture"
    )
    train: TrainSection = Field(default_factory=TrainSection, description="training")
    eval: EvalSection = Field(default_factory=EvalSection, description="acceptance and speed")

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, raw: Any) -> Any:  # `train:` (nothing) is every default, as is an empty recipe
        if isinstance(raw, dict):
            return {k: {} if v is None and k != "name" else v for k, v in raw.items()}
        return {} if raw is None else raw

    @model_validator(mode="after")
    def _across(self) -> "Recipe":
        kind = kind_named(self.draft.kind)
        foreign_options(self, check)
        kind.check_recipe(self, check)
        t = self.train.ttt_steps
        why = "capture.mode online with capture.backend hf runs a whole target on each training process's "
        why += "device; leave the map unset (or set capture.backend: vllm)"
        in_training = self.capture.mode == "online" and self.capture.backend == "hf"
        check(self.target.device_map is None or not in_training, "target.device_map", why)
        past = f"past what TTT trained (train.ttt_steps={t})"
        w = getattr(self.draft, "sliding_window", None)  # an EAGLE-3 layer's option
        window = (
            f"draft.sliding_window={w} must exceed train.ttt_steps={t}: a chain's own drafts stay in view"
        )
        check(w is None or w > t, "draft.sliding_window", window)
        n, most = self.train.pack_length, self.train.max_length
        check(n is None or self.train.pack, "train.pack_length", "needs train.pack: true")
        check(n is None or n <= most, "train.pack_length", f"{n} must not exceed train.max_length={most}")
        check(self.eval.k <= t, "eval.k", f"k={self.eval.k} drafts {past}")
        tr = self.train
        best = "chooses among validations: needs train.val_every > 0 and train.val_fraction > 0"
        check(not tr.keep_best or (tr.val_every > 0 and tr.val_fraction > 0), "train.keep_best", best)
        for i, k in enumerate(self.eval.more_k):
            check(1 <= k <= t, f"eval.more_k[{i}]", f"k={k} must be in 1..train.ttt_steps={t}")
        parallel = (
            f"{kind.summary.split(':')[0]} proposes a chain of drafts from one forward: no trees; give eval.k"
        )
        check(not kind.chains_only or not self.eval.tree, "eval.tree", parallel)
        for key, k in (
            ("eval.k", self.eval.k),
            *((f"eval.more_k[{i}]", k) for i, k in enumerate(self.eval.more_k)),
        ):
            untrained = kind.untrained_k(kind.trained_k(self.train), k)
            check(untrained is None, key, untrained)
        for i, spec in enumerate(self.eval.tree):
            try:
                steps = TreeShape.parse(spec).steps
            except ValueError as e:
                raise RecipeError(f"eval.tree[{i}]: {e}") from None
            check(steps <= t, f"eval.tree[{i}]", f"{steps} steps draft {past}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()
