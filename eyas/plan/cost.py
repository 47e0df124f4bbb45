"""The cost model of `eyas plan`: the assumptions its estimates rest on, the exact parameter counts of the
target and the draft (built on the meta device from their configs), and what they come to on a set of
GPUs: the target's weights per GPU, capture storage, draft training memory per GPU, target replicas and
each stage's throughput; `Plan` holds the figures.

Every assumption is printed with its source; `eyas plan --run DIR` replaces the throughput ones with the
rates a finished (smaller) run measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eyas.data.compact import bytes_per_token
from eyas.data.gpt_oss import GPT_OSS_SHARED, KNOWN_TARGETS
from eyas.data.target import (
    TargetCount,
    cpu_bf16_runs,
    host_memory_bytes,
    load_target_config,
    pick_dtype,
    text_config,
)
from eyas.plan.capture_memory import CaptureMemory
from eyas.plan.eval_memory import EvalMemory
from eyas.plan.flops import CaptureWork
from eyas.plan.tokens import TurnCount
from eyas.recipes.load import check_against_target
from eyas.train.kinds import kind_named, make_draft
from eyas.train.loss import chunk_positions
from eyas.train.optim import muon_params

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from eyas.recipes.schema import Recipe
    from eyas.train.kinds.config import DraftConfig

# name: (memory GB, dense bf16 TFLOP/s) -- vendor datasheets (SXM parts)
GPUS = {"H100": (80, 989), "H200": (141, 989), "B200": (180, 2250), "A100": (80, 312)}
# name: NVLink GB/s each way per GPU -- vendor datasheets (NVLink 4: 900 GB/s both ways; 5: 1.8 TB/s; 3: 600)
NVLINK_GB_S = {"H100": 450, "H200": 450, "B200": 900, "A100": 300}
# `--gpus cpu`: this machine's CPU, its memory the host's. eyas assumes no CPU's speed (they differ by 10x and
# more: AMX, AVX512-BF16, AVX2 only), so every rate comes from a smaller run of the recipe (--run)
CPU = "CPU"
RATE_STAGES = {"regen_tok_s": "regenerate", "capture_flop_s": "capture", "train_tok_s": "train"}


@dataclass
class Assumptions:
    """Every number the estimates rest on that is not counted from the recipe."""

    mean_prompt_tokens: float = 400.0  # rendered prompt, chat template included, where no source can be read
    # characters a token of prompt text where no tokenizer renders it (English prose; code and Chinese take
    # fewer): SmolLM2's 49K vocabulary takes 3.9 (HotpotQA) to 4.8 (SQuAD) on the long prose sets, 5.2 on
    # WritingBench's English requests, 3.7 on Python, 1.45 on Chinese (data/long_documents.py)
    chars_per_token: float = 4.0
    new_token_fraction: float = 0.75  # mean generated tokens / data.max_new_tokens (reasoning runs long)
    # multi-turn: the share of an earlier answer a later turn's prompt holds (gpt-oss's template keeps the
    # final channel and drops the analysis; other templates keep the whole answer: 1)
    kept_answer_fraction_harmony: float = 0.5
    # activation memory per token per TTT step, gpt-oss-120b draft dims, bf16, compiled norms/MLP, measured
    # on an H100 (docs/benchmarks.md "TTT step time and memory by sequence length"): T=32K 60.5 GiB peak,
    # T=64K with checkpoint_layer 38.0 GiB, less the measured setup's static part (weights, grads, AdamW
    # with a trained lm_head, embedding, teacher lm_head) and its teacher (teacher_bytes at its 32,000-id
    # draft vocabulary: 18.3 KB a token-step at TTT 7; the lm_head chunks are gone by the unroll's peak):
    # 236 and 65.6 KB with it
    act_bytes_per_token_step: float = 217.7e3
    act_bytes_per_token_step_checkpointed: float = 47.3e3
    # on a CPU (train.compile auto: off), float32: the bytes autograd's saved-tensor hooks see kept for
    # backward, weights and inputs apart, at gpt-oss-120b draft dims (TTT 3, T = 256 and 512: 449.3 and 449.4
    # KB); at the Qwen2.5-Coder recipe's draft dims 150.5 KB and at the demo's 15.8 KB, 8% and 5% above this
    # scaled by width; under bf16 autocast 0.70 of it (the Qwen dims' slope, T = 128 to 256; the demo's
    # 0.66). A 2-core AVX2 EPYC, torch 2.13 (docs/benchmarks.md "A 1.5B target from packages"). A whole step
    # peaks with the fused loss's chunk beside these (loss_scratch_bytes, priced on a CPU apart); the H100's
    # constants above were measured at a whole step's peak, which held the chunk (~1.1 GB, ~5 KB a
    # token-step at its T = 32K): spread over the tokens there, a little low at shorter rows, high at longer;
    # a loss over gathered anchors (P-EAGLE, DFlash: gathered_loss_bytes) is priced beside them on a GPU too
    act_bytes_per_token_step_cpu: float = 449.4e3
    cpu_bf16_act_ratio: float = 0.70
    # on a CPU the process's own floor beside a stage's tensors: the interpreter with torch, transformers and
    # eyas loaded (the Qwen2.5-Coder run's vocab stage after capture: 0.44 GB resident, 0.33 anonymous)
    cpu_process_bytes: float = 0.4e9
    # draft training tokens/s on one H100 at TTT 7, gpt-oss-120b draft dims, AdamW (docs/benchmarks.md, the
    # same section; Muon's orthogonalization per step is not in it): 22.3K at T=4K, 15.8K at 32K
    train_tok_s_h100: tuple = ((4096, 22.3e3), (32768, 15.8e3))
    # the target's forward (capture, prefill) at 30% of peak bf16 FLOP/s on the GPU that runs it, its FLOPs
    # counted with attention and padding (eyas/plan/flops.py)
    capture_mfu: float = 0.30
    # regeneration, generated tokens/s per target replica on H100s -- assumed, not measured by eyas at this
    # size: HF generate (data.backend hf), and a vLLM/SGLang server with ~128 requests in flight (data.backend
    # server or vllm)
    regen_tok_s_hf_h100: float = 100.0
    regen_tok_s_server_h100: float = 2000.0


@dataclass
class DraftCount:
    """The draft's parameters: trainable, and frozen (the target's embedding; the lm_head too under
    draft.lm_head: target_frozen), and the bytes of its optimizer's state."""

    trainable: int
    frozen: int
    config: DraftConfig
    optimizer_bytes: int


@dataclass
class OnlineSplit:
    """Online training from vLLM (capture.mode: online, capture.backend: vllm): the producer : trainer split
    of the GPUs that trains fastest, and what it comes to."""

    producer_gpus: int  # vLLM replicas x vllm.tensor_parallel_size
    trainer_gpus: int
    tok_s: float  # trained tokens/s: the slower of what the producers make and what the trainers take
    train_s: float  # every epoch runs the target's forward again


@dataclass
class Plan:
    """The figures `eyas plan` prints (tests check them). Bytes, tokens and seconds unless named otherwise;
    rates are over all the GPUs."""

    gpus: str  # "8xH100"
    gpu_memory_gb: float  # each (`--gpus cpu`: the host's)
    config_source: str  # where the target's config came from
    target: TargetCount
    draft_trainable: int
    draft_frozen: int
    target_gb_per_gpu: dict[str, float]  # {"mxfp4": GB, "bf16": GB}: the weights spread over every GPU
    replica_fits: bool  # a vLLM replica's weights fit its GPUs (vllm.tensor_parallel_size) with 10% headroom
    conversations: int | None  # None: every prompt of the sources, not known before the prompts stage
    sequences: int  # answered turns
    mean_tokens: float  # per sequence: prompt + generated
    tokens: float
    capture_bytes_per_token: int
    capture_bytes: float
    train_static_gb: float  # weights, gradients, optimizer state, frozen weights, teacher lm_head
    train_activation_gb: float  # the teacher's included
    train_teacher_gb: float  # teacher_bytes: the target's distribution a step trains against
    train_gb_per_gpu: float
    regen_s: float | None
    regen_tok_s: float  # generated tokens/s
    capture_s: float
    capture_tok_s: float  # the planned sequences' tokens (padding apart) a second, at capture_flop_s
    capture_flop_s: float  # the target's forward, FLOPs a second (flops.py's count)
    capture_work: CaptureWork  # the planned capture's FLOPs
    replicas: int  # of the target, for regeneration and capture
    gpus_per_replica: int
    train_s: float
    train_tok_s: float
    measured: list[str]  # the rates --run measured: capture_flop_s, regen_tok_s, train_tok_s
    read_bytes_s: float  # offline training reads the capture this fast at train_tok_s
    allreduce_bytes: float  # DDP: the fp32 gradients all-reduced each optimizer step
    allreduce_s: float  # ring all-reduce over NVLink (the datasheet bandwidth, each way)
    step_s: float  # one optimizer step at train_tok_s
    online: OnlineSplit | None  # online training from vLLM on these GPUs; None on one GPU
    process_bytes: dict[
        str, float
    ]  # per stage, eyas's own process (process_memory; capture: capture_memory's, eval: eval_memory's total)
    host_element: int  # bytes a target parameter in the dtype the target computes in (element_bytes)
    capture_memory: CaptureMemory | None  # an hf capture's weights, shard and peak moment (capture_memory.py)
    capture_longest_from: str  # where capture_memory's longest sequence comes from (longest_sequence)
    eval_memory: (
        EvalMemory  # eval's loop: weights, KV caches, a prefill forward's peak (eyas/plan/eval_memory.py)
    )
    assumptions: Assumptions
    turns: TurnCount | None  # counted from --run's prompts stage
    stages_measured: list[str]  # --run's finished stages the figures come from
    setup_s: dict[
        str, float
    ]  # each stage's time outside its rate as --run took it (in regen_s, capture_s, train_s)
    unread: str = ""  # the sources a plan without --run could not read (none could), and why
    train_in_flops: bool = False  # --run's training rate carried in FLOPs of its rows (train_work.py)


def parse_gpus(text: str) -> tuple[int, str]:
    """ "8xH100" -> (8, "H100"); "A100 80GB" / "A100-80GB" count as A100."""
    t = text.replace(" ", "").upper().replace("-80GB", "").replace("80GB", "")
    if t in (CPU, f"1X{CPU}"):
        return 1, CPU
    n, _, kind = t.partition("X") if "X" in t else ("1", "", t)
    if not n.isdigit() or int(n) < 1 or kind not in GPUS:
        raise ValueError(
            f"--gpus {text!r}: expected NxGPU with GPU one of {', '.join(GPUS)} (e.g. 8xH100), or cpu"
        )
    return int(n), kind


def device_memory_gb(kind: str) -> float:
    """A GPU's memory from its datasheet; `cpu`: this host's physical memory."""
    if kind == CPU:
        return host_memory_bytes() / 1e9
    return GPUS[kind][0]


def cpu_rates(measured: dict[str, float], n_gpu: int, replicas: int) -> tuple[float, float, float]:
    """`--gpus cpu`: the rates --run measured (regeneration's and training's tokens/s, capture's FLOP/s), or
    an error naming the stages it has not run."""
    missing = [stage for rate, stage in RATE_STAGES.items() if not measured.get(rate)]
    if missing:
        raise ValueError(
            f"--gpus cpu: eyas assumes no CPU's speed; pass --run DIR, a smaller run of this recipe that has "
            f"finished {', '.join(missing)} (e.g. `eyas run RECIPE --out DIR data.num_prompts=32 "
            "train.max_steps=8`)"
        )
    return (
        measured["regen_tok_s"] * replicas,
        measured["capture_flop_s"] * replicas,
        measured["train_tok_s"] * n_gpu,
    )


def target_config(recipe: Recipe) -> tuple[PretrainedConfig, str]:
    """The target's config and where it came from (a gpt-oss target: a local copy, else eyas's own)."""

    name = recipe.target.model
    if name not in KNOWN_TARGETS:
        return load_target_config(name, recipe.target.trust_remote_code), "its config.json"
    from transformers import AutoConfig, GptOssConfig

    try:  # a local copy (hub cache or directory) when there is one; the hub is not asked
        return AutoConfig.from_pretrained(name, local_files_only=True), "its config.json (local copy)"
    except OSError:
        return GptOssConfig(**GPT_OSS_SHARED, **KNOWN_TARGETS[name]), "eyas's built-in copy of its hub config"


def count_draft(recipe: Recipe, cfg: PretrainedConfig) -> DraftCount:
    """Parameters of the draft the recipe trains on this target, built on the meta device."""
    from eyas.train.trainer import draft_config, lm_head_trains  # lazy: httpx

    tcfg = text_config(cfg)
    ids = check_against_target(recipe, tcfg.num_hidden_layers, tcfg.vocab_size)
    dcfg = draft_config(recipe, tcfg, ids, min(recipe.vocab.draft_vocab_size, tcfg.vocab_size))
    with torch.device("meta"):
        draft = make_draft(dcfg)
    draft.lm_head.weight.requires_grad_(lm_head_trains(recipe.draft.lm_head))  # as training builds it
    trainable = draft.num_parameters()
    return DraftCount(
        trainable=trainable,
        frozen=draft.num_parameters(False) - trainable,
        config=dcfg,
        optimizer_bytes=optimizer_bytes(recipe.train.optimizer, draft),
    )


def optimizer_bytes(optimizer: str, draft: torch.nn.Module) -> int:
    """fp32 optimizer state of `train.optimizer` (train/optim.py): AdamW keeps two moments per trainable
    parameter; Muon keeps one momentum on the hidden matrices, AdamW's two on the rest."""

    named = [(n, p) for n, p in draft.named_parameters() if p.requires_grad]
    muon = sum(p.numel() for p in muon_params(named)) if optimizer == "muon" else 0
    return 4 * muon + 8 * (sum(p.numel() for _, p in named) - muon)


def shard_buffer_bytes(recipe: Recipe, token_bytes: int, tokens: float) -> float:
    """Host memory an offline capture holds for its shards: one shard's rows, packed as they come into
    tensors reused for every shard (data/shards.py ShardBuffer): capture.shard_tokens less one, plus the
    longest sequence (data.max_prompt_tokens + data.max_new_tokens), or every token, when fewer. On a CPU it
    is the capture process's memory beside the target's."""
    d = recipe.data
    return min(recipe.capture.shard_tokens - 1 + d.max_prompt_tokens + d.max_new_tokens, tokens) * token_bytes


def capture_bytes_per_token(recipe: Recipe, cfg: PretrainedConfig, n_aux: int, offline: bool = False) -> int:
    """Stored capture bytes per token (0 for online capture: nothing is stored, unless `offline`: what an
    offline capture in the recipe's formats would store)."""

    c = recipe.capture
    dtype_bytes = 4 if c.dtype == "float32" else 2
    return (
        0
        if c.mode == "online" and not offline
        else bytes_per_token(n_aux, cfg.hidden_size, c.aux_format, c.teacher, c.teacher_topk, dtype_bytes)
    )


def training_memory(
    recipe: Recipe, cfg: PretrainedConfig, draft: DraftCount, a: Assumptions, cpu: bool = False
) -> tuple[float, float]:
    """Draft training bytes per GPU (DDP: everything replicated; `cpu`: this host's process) -> (static,
    activations). Static: fp32 weights, gradients and optimizer state, the fp32 frozen weights (embedding;
    lm_head where frozen), the teacher lm_head (teacher final) and its copy in the autocast dtype
    (`teacher_cast_bytes`). Activations: the measured bytes per token per TTT step (on a GPU, bf16 and
    compiled; on a CPU, as train.compile auto leaves it, uncompiled), scaled by the draft's layer width, for
    the tokens of a row one GPU holds (train.sequence_parallel P: T / P of each; train/sequence_parallel.py),
    DFlash's blocks and context for the whole row (its blocks sit where the answers are: one shard may run
    them all)."""
    tr = recipe.train
    bf16 = trains_bf16(recipe, cpu)
    static = (
        8 * draft.trainable
        + draft.optimizer_bytes
        + 4 * draft.frozen
        + (4 * cfg.vocab_size * cfg.hidden_size if recipe.capture.teacher == "final" else 0)
        + teacher_cast_bytes(recipe, draft, cpu)
    )
    per_ts = a.act_bytes_per_token_step_checkpointed if tr.checkpoint_layer else a.act_bytes_per_token_step
    if cpu:  # checkpoint_layer: not measured on a CPU, priced at the H100's ratio
        ratio = per_ts / a.act_bytes_per_token_step
        per_ts = a.act_bytes_per_token_step_cpu * (a.cpu_bf16_act_ratio if bf16 else 1.0) * ratio
    # measured at gpt-oss-120b draft dims: hidden 2880, intermediate 17280
    scale = (2 * draft.config.hidden_size + draft.config.intermediate_size) / (2 * 2880 + 17280)
    layers = draft.config.num_layers  # measured with one layer; each holds its own per step
    rows = shard_rows(tr)
    shard, whole = grid_bytes(recipe, draft)
    grids = shard * rows + whole * tr.max_length * tr.batch_size
    whole_row = kind_named(recipe.draft.kind).unrolled_whole_row()  # DFlash's blocks: the whole row's
    unrolled_rows = tr.max_length * tr.batch_size if whole_row else rows
    unrolled = per_ts * scale * layers * unrolled_rows * unrolled_steps(recipe)
    if cpu:  # the CPU's constant is what autograd keeps; a step peaks with a loss's chunk beside it
        unrolled += loss_scratch_bytes(recipe, draft, unrolled_rows)
    elif gathered := gathered_loss_bytes(recipe, draft, unrolled_rows):
        # the H100's constant holds EAGLE-3's chunk in place and its lm_head's cast (32,000 ids), spread over
        # every token-step; a kind whose loss gathers its anchors runs fewer of them: priced beside (for
        # P-EAGLE, whose depth 0 runs in place, an upper bound)
        unrolled += gathered + loss_cast_bytes(recipe, draft, cpu=False)
    # the teacher is held through the step; its lm_head chunks come and go before the unroll runs
    return static, teacher_bytes(draft, rows) + max(
        teacher_scratch_bytes(recipe, draft, rows), unrolled + grids
    )


def shard_rows(tr) -> int:
    """The positions of a step one GPU holds: batch x its share of a row (train.sequence_parallel)."""
    return math.ceil(tr.max_length / tr.sequence_parallel) * tr.batch_size


TEACHER_CHUNK = 128  # positions per full-vocabulary lm_head chunk (train/ttt.py target_view's `chunk`)


def teacher_bytes(draft: DraftCount, rows: int) -> float:
    """The teacher a training step holds throughout (train/ttt.py target_view, or topk_view), for the `rows`
    positions one GPU holds: fp32 probabilities over the draft vocabulary, the argmax (int64), the
    in-vocabulary mass (fp32) and flag (bool) at every position. gpt-oss-120b's DFlash recipe (every one of
    201,088 ids, T = 8,192): 6.6 GB."""
    return rows * (4 * draft.config.draft_vocab_size + 8 + 4 + 1)


def trains_bf16(recipe: Recipe, cpu: bool) -> bool:
    """Whether training runs under bf16 autocast on the planned devices (train/trainer.py mixed_precision):
    GPUs, unless train.mixed_precision is no; this CPU, where it asks for bf16 and the CPU has bf16
    arithmetic (data/target.py cpu_bf16_runs, which says when it has not; auto is no on a CPU)."""
    mp = recipe.train.mixed_precision
    if cpu:
        return mp == "bf16" and cpu_bf16_runs(torch.device("cpu"), "train.mixed_precision bf16")
    return mp != "no"


def teacher_cast_bytes(recipe: Recipe, draft: DraftCount, cpu: bool = False) -> float:
    """The fp32 teacher lm_head's copy in the autocast dtype, cast once and kept (train/ttt.py
    TTTModule.teacher_weight): 2 V H_t bytes (1.16 GB at gpt-oss-120b); none where training runs in fp32
    on the planned devices (trains_bf16; `cpu`: this host) or with a top-k teacher."""
    if recipe.capture.teacher == "topk" or not trains_bf16(recipe, cpu):
        return 0
    return 2 * draft.config.vocab_size * draft.config.target_hidden_size


def teacher_scratch_bytes(recipe: Recipe, draft: DraftCount, rows: int) -> float:
    """What computing the teacher holds for a moment, before the unroll: target_view's one chunk of
    positions at a time (its full-vocabulary logits in bf16 and fp32 beside the previous chunk's fp32 logits
    and draft slice, 10 V + 4 V_d bytes a position; or, later, the logits, the slice, the softmax's exponent
    and logsumexp's copy, 8 V + 8 V_d); topk_view (capture.teacher topk): the renormalised copy of its
    probabilities."""
    V, V_d = draft.config.vocab_size, draft.config.draft_vocab_size
    if recipe.capture.teacher == "topk":
        return rows * 4 * V_d
    return min(TEACHER_CHUNK, rows) * max(10 * V + 4 * V_d, 8 * V + 8 * V_d)


# bytes a logit the fused loss holds at its peak within a chunk (train/loss.py loss_and_grad), by train.loss:
# kl the fp32 logits, log-softmax, exponent and product; ce the one-hot besides; lk the softmax, its minimum
# with the teacher and their products (live tensors counted by a dispatch mode: tests/test_plan.py)
LOSS_CHUNK_BYTES = {"kl": 16, "ce": 20, "lk": 28}


def loss_scratch_bytes(recipe: Recipe, draft: DraftCount, rows: int) -> float:
    """What the loss (train/ttt.py step_loss) holds for a moment on a CPU beyond the kept activations, for
    `rows` unrolled positions: the fused loss's (train/loss.py _LinearLoss) one chunk of positions,
    LOSS_CHUNK_BYTES a logit over at most loss.py's BUDGET logits, each chunk freed before the next; or,
    where the kind's loss runs over kept anchors alone (`gathered_loss_bytes`), that one, whichever is
    larger; and under bf16 autocast the lm_head's copy (`loss_cast_bytes`). Measured (torch.profiler's
    memory profile, a 2-core AVX2 EPYC, float32): at the SmolLM2 long recipe's draft, T = 8,192, TTT 5, a
    step's live bytes peak at 3.72 GB above its start, at the last step's loss: 2.34 GB kept for backward,
    the teacher 0.27, this chunk 4 x 268 MB."""
    B, V_d = recipe.train.batch_size, draft.config.draft_vocab_size
    in_place = kind_named(recipe.draft.kind).loss_rows(recipe.train)[0]
    whole = LOSS_CHUNK_BYTES[recipe.train.loss] * min(rows, B * chunk_positions(B, V_d)) * V_d
    gathered = gathered_loss_bytes(recipe, draft, rows)
    return max(whole if in_place else 0.0, gathered) + loss_cast_bytes(recipe, draft, cpu=True)


def gathered_loss_bytes(recipe: Recipe, draft: DraftCount, rows: int) -> float:
    """A loss over kept anchors alone (DraftKind.loss_rows: P-EAGLE's depths past 0, DFlash's drafts), for
    `rows` unrolled positions: the largest step's anchors (train/ttt.py step_loss with `rows`) gathered into
    one row, their teacher's fp32 probabilities and fp32 states copied (4 V_d + 16 H bytes an anchor: the
    states, their norm's two steps and the gradient's row), then the fused loss's one chunk over them
    (B = 1). The P-EAGLE recipe's depth 1 (5,735 anchors of 8,192 at 32,000 ids): 1.00 GB of copies (0.73
    of them the teacher's) beside its 1.07 GB chunk; 0: a kind whose loss gathers none. An upper bound for
    P-EAGLE: its later depths keep fewer (COD), and depth 1's loss runs before they exist."""
    V_d, H = draft.config.draft_vocab_size, draft.config.hidden_size
    kept = math.ceil(kind_named(recipe.draft.kind).loss_rows(recipe.train)[1] * rows)
    chunk = LOSS_CHUNK_BYTES[recipe.train.loss] * min(kept, chunk_positions(1, V_d)) * V_d
    return chunk + kept * (4 * V_d + 16 * H)


def loss_cast_bytes(recipe: Recipe, draft: DraftCount, cpu: bool) -> float:
    """The draft lm_head's bf16 copy the fused loss makes at each call under bf16 autocast (train/loss.py `W`,
    freed when the call returns; the teacher's is cast once and kept: teacher_cast_bytes): 2 V_d H, 1.16 GB
    at DFlash's whole vocabulary; 0 where training runs in fp32 (trains_bf16; `cpu`: this host)."""
    return 2 * draft.config.draft_vocab_size * draft.config.hidden_size if trains_bf16(recipe, cpu) else 0


def grid_bytes(recipe: Recipe, draft: DraftCount) -> tuple[float, float]:
    """The per-token bytes on the whole (B, T) grid beyond the unrolled steps (DraftKind.grid_bytes) -> (bytes
    a token of the rank's shard, bytes a token of the whole row: DFlash's context, which a rank holds whole
    under train.sequence_parallel; without it, both count every token)."""
    return kind_named(recipe.draft.kind).grid_bytes(recipe.train, draft.config)


def work_per_token(recipe: Recipe) -> float:
    """A row's training compute in layer-steps (measured: one layer, TTT 7): the unrolled steps x the draft's
    decoder layers (the lm_head and loss of a step counted as a layer's: an upper bound for deep drafts)."""
    return unrolled_steps(recipe) * recipe.draft.num_layers


def unrolled_steps(recipe: Recipe) -> float:
    """The steps' worth of per-token activations and compute one training row costs (DraftKind.unrolled):
    EAGLE-3, train.ttt_steps (every step over every position); P-EAGLE, depth 0 over every position and depth
    d over COD's share max(cod_ratio**d, cod_floor) of them (3.37 for 8 depths at 0.7 / 0.2)."""
    return kind_named(recipe.draft.kind).unrolled(recipe.train)


def vllm_replicas(
    recipe: Recipe, held_bytes: float, n_gpu: int, gpu_memory_gb: float
) -> tuple[int, int, bool]:
    """vLLM's replicas from the recipe's `vllm` section on `n_gpu` GPUs (every GPU where vllm.devices is
    unset) -> (replicas, GPUs per replica, whether `held_bytes` fits a replica's GPUs with 10% headroom)."""
    v = recipe.vllm
    tp = v.tensor_parallel_size
    devices = len(v.devices) if v.devices is not None else n_gpu
    return v.replicas or max(devices // tp, 1), tp, held_bytes <= tp * 0.9 * gpu_memory_gb * 1e9


def online_split(n_gpu: int, tp: int, replica_tok_s: float, gpu_train_tok_s: float, tokens_all_epochs: float):
    """The producer : trainer split of `n_gpu` GPUs (producers in replicas of `tp` GPUs, each making
    `replica_tok_s`; trainers taking `gpu_train_tok_s` each) that trains fastest -> OnlineSplit, or None
    where no split leaves a GPU to each side."""
    best = None
    for p in range(1, n_gpu // tp + 1):
        trainers = n_gpu - p * tp
        if trainers < 1:
            break
        rate = min(p * replica_tok_s, trainers * gpu_train_tok_s)
        if best is None or rate > best.tok_s:
            best = OnlineSplit(p * tp, trainers, rate, tokens_all_epochs / rate)
    return best


def allreduce(trainable: int, n_gpu: int, kind: str) -> tuple[float, float]:
    """DDP's gradient all-reduce each optimizer step: (fp32 gradient bytes, seconds of a ring all-reduce
    over NVLink: each GPU sends and receives 2 (n-1)/n of them)."""
    grads = 4 * trainable
    return grads, 2 * (n_gpu - 1) / n_gpu * grads / (NVLINK_GB_S[kind] * 1e9) if n_gpu > 1 else 0.0


def element_bytes(name: str | None, cpu: bool) -> int:
    """Bytes per parameter of a recipe dtype as the planned devices compute in it: GPUs, bf16 unless float32
    (auto: bf16); this CPU, the dtype data/target.py pick_dtype loads the target in (float32 for auto, and
    for bfloat16 where the CPU has no bf16 arithmetic, which pick_dtype says)."""
    if cpu:
        return torch.finfo(pick_dtype(name or "auto", torch.device("cpu"))).bits // 8
    return 4 if name == "float32" else 2


def process_memory(
    recipe: Recipe,
    cfg: PretrainedConfig,
    draft: DraftCount,
    a: Assumptions,
    held: float,
    held_eval: float,
    eval_bytes: int,
    cpu: bool = False,
) -> dict[str, float]:
    """Peak bytes of eyas's own process in each stage, above the interpreter's: `held`, the target as
    transformers holds it, where the stage runs it in this process (the hf backends, online training's hf
    target); training's state and activations (training_memory); eval's loop: the target as it holds it
    (`held_eval`, eval.target_dtype) and the draft but its embedding (the target's), in `eval_bytes` per
    parameter.
    vLLM's processes are not counted here (vllm.gpu_memory_utilization of each GPU). `cpu`: this host's
    process (training_memory)."""
    static, act = training_memory(recipe, cfg, draft, a, cpu)
    online_hf = recipe.capture.mode == "online" and recipe.capture.backend == "hf"
    return {
        "regenerate": held if recipe.data.backend == "hf" else 0.0,
        "capture": held if recipe.capture.backend == "hf" and not online_hf else 0.0,
        "train": static + act + (held if online_hf else 0.0),
        # the draft's embedding is the target's own tensor (train/checkpoint.py load_draft_beside)
        "eval": held_eval + (draft.trainable + draft.frozen - cfg.vocab_size * cfg.hidden_size) * eval_bytes,
    }


def target_replicas(recipe: Recipe, target: TargetCount, n_gpu: int, gpu_memory_gb: float) -> tuple[int, int]:
    """Regeneration and capture run one shard per replica of the target (data/sharding.py), each on as
    few GPUs as hold its weights with 10% headroom -> (replicas, GPUs per replica)."""
    held = target.bytes_bf16 if recipe.target.weights == "dequantized" else target.bytes_mxfp4
    per_replica = math.ceil(held / (0.9 * gpu_memory_gb * 1e9))
    return max(1, n_gpu // per_replica), per_replica


def train_tok_s_h100(T: int, a: Assumptions) -> float:
    """Log-linear in T between the two measured lengths (held flat outside them)."""
    (t0, r0), (t1, r1) = a.train_tok_s_h100
    x = min(max(math.log(T), math.log(t0)), math.log(t1))
    return r0 + (r1 - r0) * (x - math.log(t0)) / (math.log(t1) - math.log(t0))


def throughputs(
    recipe: Recipe, measured: dict[str, float], a: Assumptions, kind: str, n_gpu: int, replicas: int
) -> tuple[float, float, float]:
    """Rates over every GPU -> (regeneration's generated tokens/s, capture's FLOP/s, training's tokens/s):
    the rates `measured` in a run (per target replica; training per GPU) where there are some, else the
    assumptions, scaled from an H100 by bf16 FLOP/s (`--gpus cpu`: measured ones only)."""
    if kind == CPU:
        return cpu_rates(measured, n_gpu, replicas)
    tr, tflops = recipe.train, GPUS[kind][1]
    capture_flop_s = (measured.get("capture_flop_s") or a.capture_mfu * tflops * 1e12) * replicas
    gpu_scale = tflops / GPUS["H100"][1]
    regen_rate = a.regen_tok_s_hf_h100 if recipe.data.backend == "hf" else a.regen_tok_s_server_h100
    regen_tok_s = (measured.get("regen_tok_s") or gpu_scale * regen_rate) * replicas
    train_tok_s = (
        measured.get("train_tok_s")
        or gpu_scale * train_tok_s_h100(tr.max_length, a) * 7 / work_per_token(recipe)
    ) * n_gpu
    return regen_tok_s, capture_flop_s, train_tok_s
