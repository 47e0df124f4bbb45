"""The TTT trainer: accelerate (one process; DDP under `torchrun` or `accelerate launch`; FSDP2 and
DeepSpeed ZeRO-2/3 with the configs in recipes/accelerate/, see train/distributed.py), AdamW,
linear warmup + cosine decay, gradient clipping, bf16 autocast where the device has it.

Inputs: RUN/capture (shards of aux states + the teacher, vLLM layer ids; or, with `capture.mode:
online`, no shards: the target runs here, train/online.py), RUN/vocab (d2t, t2d).
Outputs: RUN/train/log.jsonl (per-step TTT metrics, and validation lines {"step", "val"}),
RUN/train/curves.png, RUN/train/state/ (optimizer, scheduler, RNG and step, for resuming: train/state.py),
RUN/train/checkpoint-final/ (the draft, EAGLE-3 format); `train.report_to` also sends the
metrics to wandb / tensorboard / trackio through accelerate's trackers.

`run_train`: `setup` (the Accelerator, the draft, the data, the prepared module and optimizer), `resume`
(the saved state), `train_steps` (the step loop: SIGINT / SIGTERM save the state and stop), `finish` (the
last validation, the gathered weights, checkpoint-final and DONE.json).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from eyas.data.shards import ShardDataset, read_index
from eyas.data.splits import held_out_split, run_groups, same_split, split_record
from eyas.data.target import check_fits, cpu_bf16_runs, load_head_weights, load_target_config, text_config
from eyas.infra import io, layout
from eyas.infra.errors import InputError
from eyas.infra.interrupts import Interrupted, StopRequest, ignore_in_worker
from eyas.recipes.schema import Recipe
from eyas.train.kinds.config import OPTIONS, DraftConfig

from .checkpoint import load_draft, save_draft
from .distributed import (
    accelerator_kwargs,
    check_deepspeed,
    configure_fsdp2,
    full_state_dict,
    launcher_kind,
    process_state,
)
from .kinds import kind_named, kind_of, make_draft
from .model import Eagle3Draft, Rotary
from .online import OnlineTarget, RegeneratedSequences
from .online_vllm import ProducerStopped, VllmFeed, feed_stats, start_feed
from .optim import make_optimizer
from .packing import PackedRows, collate_rows, cut_note, plan_rows
from .schedule import MicroBatches, epoch_micro_batches, evaluation_micro_batches, updates_per_epoch
from .sequence_parallel import SequenceParallel, check_heads
from .state import Saved, load_latest, resume_layout, save_state, sum_over_processes
from .ttt import TTTModule, TTTOutput, model_inputs, simulated_tau
from .validation import sampled_at_t1, validate

if TYPE_CHECKING:
    from accelerate import Accelerator

    from eyas.recipes.schema import TrainSection


def draft_config(recipe: Recipe, tcfg, aux_layer_ids: list[int], draft_vocab_size: int) -> DraftConfig:
    """The draft's shape: the target's text config with the recipe's `draft` overrides."""
    d, kind = recipe.draft, kind_named(recipe.draft.kind)
    return DraftConfig.from_target_config(
        tcfg,
        aux_layer_ids,
        draft_vocab_size,
        target_model=recipe.target.model,
        intermediate_size=d.intermediate_size,
        num_attention_heads=d.num_attention_heads,
        num_key_value_heads=d.num_key_value_heads,
        head_dim=d.head_dim,
        rms_norm_eps=d.rms_norm_eps,
        # a key its kind's section lacks (recipes/draft.py: DFlash has no EAGLE-3 layer options, EAGLE-3 no
        # mask token) is DraftConfig's default
        norm_before_fc=getattr(d, "norm_before_fc", None),
        norm_before_residual=getattr(d, "norm_before_residual", None),
        num_layers=d.num_layers,
        # P-EAGLE never feeds a draft's output back (one forward a round): norm_output has no effect on it,
        # and vLLM's speculators loader drops it for peagle
        norm_output=getattr(d, "norm_output", False) and kind.feeds_output_back,
        sliding_window=getattr(d, "sliding_window", None),
        kind=d.kind,
        mask_token_id=mask_token(d, tcfg) if kind.mask_slots else None,
        block_size=getattr(d, "block_size", None),
        attention_bias=getattr(d, "attention_bias", False) or None,
        trained_k=kind.trained_k(recipe.train),
    )


def mask_token(d, tcfg) -> int:
    """draft.mask_token_id, else the target's pad token (gpt-oss: 199999, <|endoftext|>), else the vocab's
    last id: a token the mask slots take as input (its embedding is the target's, frozen; mask_hidden
    learns what the slots need)."""
    if d.mask_token_id is not None:
        if d.mask_token_id >= tcfg.vocab_size:
            raise ValueError(f"draft.mask_token_id={d.mask_token_id}: the target has {tcfg.vocab_size} ids")
        return d.mask_token_id
    pad = getattr(tcfg, "pad_token_id", None)
    return pad if isinstance(pad, int) and 0 <= pad < tcfg.vocab_size else tcfg.vocab_size - 1


def build_draft(recipe: Recipe, run_dir: Path, heads: dict[str, torch.Tensor]) -> Eagle3Draft:
    """A fresh head sized from the target config, with the target's embedding `heads["embed"]` (V, H), the
    run's vocab map and, by `draft.lm_head`, the target's lm_head rows `heads["lm_head"]` (V, H) of the draft
    vocab (or the warm-start checkpoint of `draft.init_from`)."""

    index = read_index(run_dir / "capture")
    vocab = load_file(str(run_dir / "vocab" / "vocab.safetensors"))
    tcfg = text_config(load_target_config(recipe.target.model, recipe.target.trust_remote_code))
    cfg = draft_config(recipe, tcfg, index["aux_layer_ids"], int(vocab["d2t"].numel()))
    d = recipe.draft
    if d.init_from:
        draft = load_draft(d.init_from)
        keys = ("aux_layer_ids", "draft_vocab_size", *OPTIONS)
        # a field of one kind only is None on another (kind is compared too: another kind's draft differs)
        differ = [k for k in keys if getattr(draft.config, k, None) != getattr(cfg, k, None)]
        if differ:
            raise ValueError(
                f"draft.init_from={d.init_from}: "
                + ", ".join(
                    f"its {k} {getattr(draft.config, k, None)!r} != this run's {getattr(cfg, k, None)!r}"
                    for k in differ
                )
            )
        draft.config.trained_k = cfg.trained_k  # what this run trains (another block_lengths, more steps)
        return draft
    torch.manual_seed(recipe.train.seed)
    draft = make_draft(cfg)
    # copy_ casts in place: no fp32 temporary of the (V, H) tables (2.3 GB each at gpt-oss's vocab)
    draft.embed_tokens.weight.data.copy_(heads["embed"])
    draft.set_vocab_map(vocab["d2t"], vocab["t2d"])
    if d.lm_head != "random":  # speculators: lm_head = the target's lm_head[t2d], frozen
        whole = bool(vocab["t2d"].all())  # a draft vocab of every id (DFlash's): no gathered copy either
        draft.lm_head.weight.data.copy_(heads["lm_head"] if whole else heads["lm_head"][vocab["t2d"]])
        draft.lm_head.weight.requires_grad_(lm_head_trains(d.lm_head))
    return draft


def lm_head_trains(lm_head: str) -> bool:
    """Whether draft.lm_head = `lm_head` leaves the draft's lm_head trainable (target_frozen does not)."""
    return lm_head != "target_frozen"


def lr_lambda(total: int, warmup: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return f


def flat_config(d: dict, prefix: str = "") -> dict:
    """The recipe as flat `section.key` scalars, for experiment trackers."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
    return out


def tracker_metrics(m: dict, split: str) -> dict:
    """A log entry (training) or validation dict -> flat scalar metrics, per TTT step j."""
    out = {f"{split}/loss": m["loss"]}
    for j, a in enumerate(m["acc"]):
        out[f"{split}/acc_{j}"] = a
    for j, a in enumerate(m["cond_acc"]):
        out[f"{split}/cond_acc_{j}"] = a
    if "simulated_tau" in m:
        for k, t in enumerate(m["simulated_tau"], start=1):
            out[f"{split}/simulated_tau_k{k}"] = t
        for k, t in enumerate(m.get("simulated_tau_t1", []), start=1):
            out[f"{split}/simulated_tau_t1_k{k}"] = t
        for k, t in enumerate(m.get("replayed_tau", []), start=1):
            out[f"{split}/replayed_tau_k{k}"] = t
    else:
        out[f"{split}/simulated_tau"] = m["simulated_acceptance"]
    return out


def step_metrics(outs: list) -> dict:
    """One optimizer step's training metrics from its micro-batches' TTT outputs (this process):
    counts summed before dividing; the loss is the mean of the micro-batch losses."""
    if not outs:
        return {"loss": 0.0, "acc": [], "cond_acc": [], "step_loss": [], "simulated_acceptance": 1.0}
    steps = len(outs[0].step_count)

    def tot(name: str) -> list[float]:  # the field summed over the micro-batches, per TTT step
        return [sum(getattr(o, name)[j] for o in outs) for j in range(steps)]

    n, right, base, cond = tot("step_count"), tot("step_right"), tot("step_cond_base"), tot("step_cond_right")
    cond_acc = [c / max(b, 1) for c, b in zip(cond, base)]
    return {
        "loss": sum(o.loss_value for o in outs) / len(outs),
        "acc": [r / max(c, 1) for r, c in zip(right, n)],
        "cond_acc": cond_acc,
        "step_loss": [x / len(outs) for x in tot("step_loss")],
        "simulated_acceptance": simulated_tau(cond_acc)[-1] if cond_acc else 1.0,
    }


def compile_math(setting: str, acc: Accelerator) -> bool:
    """train.compile: auto = on CUDA unless DeepSpeed ZeRO-3 partitions the weights (its hooks gather
    them per submodule, which a compiled graph would not see)."""
    plugin = acc.state.deepspeed_plugin
    zero3 = plugin is not None and plugin.zero_stage == 3
    if setting == "on" and zero3:
        raise ValueError(
            "train.compile: on does not work under DeepSpeed ZeRO-3 (it gathers each "
            "submodule's weights in hooks a compiled graph skips); use auto or off, or FSDP2 "
            "(fsdp2.yaml)"
        )
    return setting == "on" or (setting == "auto" and acc.device.type == "cuda" and not zero3)


def mixed_precision(setting: str) -> str:
    """`train.mixed_precision` for accelerate: auto is bf16 where CUDA has it, else no; bf16 on a CPU
    without bf16 arithmetic is no (data/target.py `cpu_bf16_runs`, which says so)."""
    if setting == "bf16" and not torch.cuda.is_available():
        return setting if cpu_bf16_runs(torch.device("cpu"), "train.mixed_precision bf16") else "no"
    if setting != "auto":
        return setting
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


@dataclass
class TrainData:
    """The captured sequences as this process's training micro-batches and validation batches."""

    dataset: PackedRows  # the training rows (sequences packed up to train.max_length)
    collate: Callable[[list[dict]], dict[str, torch.Tensor]]
    # collated batches -> on the device (online: the target's states added; from vLLM: asked for ahead)
    stream: Callable[[Iterable[dict]], Iterator[dict]]
    val_ids: list[int]  # the held-out sequences
    val_batches: Callable[[], Iterator[dict]]  # this process's validation batches, on the device
    per_epoch: int  # optimizer steps per epoch


@dataclass
class Training:
    """A training run: what `setup` made, and how far the step loop has come."""

    recipe: Recipe
    acc: Accelerator
    module: torch.nn.Module  # the TTTModule, prepared (DDP / FSDP2 / DeepSpeed wrap it)
    opt: torch.optim.Optimizer  # prepared
    sched: torch.optim.lr_scheduler.LambdaLR  # stepped by us, once per optimizer step
    params: list[torch.nn.Parameter]  # the trainable ones, as prepared (FSDP2: sharded DTensors)
    draft_config: DraftConfig
    trainable: int  # trainable parameters, counted before prepare (ZeRO-3 partitions them)
    data: TrainData
    total: int  # optimizer steps
    out_dir: Path  # RUN/train
    feed: VllmFeed | None = None  # online training from vLLM: the producers' clients (train/online_vllm.py)
    sp: SequenceParallel | None = None  # train.sequence_parallel > 1: this process's shard of each row
    step: int = 0  # optimizer steps done
    tokens: int = 0  # trained on by this process (the main process also carries a resumed state's count);
    # under sequence parallelism by the first process of each group
    loop_s: float = 0.0  # this process's seconds in the step loop (setup and the end not counted)
    loop_started: float | None = None  # time.perf_counter() when this process's step loop began
    started: float = 0.0  # time.perf_counter() when this process began the stage (run_train)
    resumed: Saved | None = None  # the saved state this process went on from
    last: dict = field(default_factory=dict)  # the last step's log entry
    best: dict | None = None  # train.keep_best: the kept checkpoint's step, metric, score and validation

    @property
    def log_path(self) -> Path:
        return self.out_dir / "log.jsonl"

    @property
    def dp(self) -> tuple[int, int]:
        """(D, this process's index among them): the processes dealt different rows."""
        if self.sp is not None:
            return self.sp.dp_size, self.sp.dp_rank
        return self.acc.num_processes, self.acc.process_index

    @property
    def state_dir(self) -> Path:
        return self.out_dir / "state"

    def elapsed_s(self) -> float:
        """The run's wall seconds so far: the saved state's, and this process's since it began."""
        return (self.resumed.elapsed_s if self.resumed else 0.0) + time.perf_counter() - self.started

    def run_loop_s(self) -> float:
        """The seconds of the run's step loops so far: the saved state's, and this process's loop."""
        mine = self.loop_s or (time.perf_counter() - self.loop_started if self.loop_started else 0.0)
        return (self.resumed.loop_s if self.resumed else 0.0) + mine

    def save(self) -> None:
        """The training state at this step (every process must call: train/state.py save_state)."""
        seconds = (self.elapsed_s(), self.run_loop_s())
        save_state(self.acc, self.state_dir, self.step, self.tokens, self.layout, seconds)

    @property
    def layout(self) -> dict:
        """What the saved state records and a resume must match (train/state.py resume_layout)."""
        return resume_layout(self.acc.num_processes, launcher_kind(), self.recipe.to_dict())


def run_train(recipe: Recipe, run_dir: str | Path, progress: bool = True) -> dict:
    """Train on this process's share of every global batch (train/schedule.py); under torchrun or
    `accelerate launch` every process runs this, and only the main process writes shared files."""
    run_dir = Path(run_dir)
    if layout.is_done(run_dir, "train"):
        return layout.read_done(run_dir, "train")
    t_start = time.perf_counter()
    t = setup(recipe, run_dir)
    t.started = t_start
    try:
        resume(t)
        wandb = {"wandb": {"dir": str(t.out_dir)}} if recipe.train.report_to == "wandb" else {}
        t.acc.init_trackers(recipe.name, config=flat_config(recipe.to_dict()), init_kwargs=wandb)
        if validation_missed(t):  # the run stopped during the validation of the step it saved
            run_validation(t)
        t.loop_started = time.perf_counter()
        train_steps(t, progress)
        t.loop_s = time.perf_counter() - t.loop_started
        return finish(t, run_dir)
    finally:
        if t.feed is not None:  # online from vLLM: the clients closed, the producers stopped
            t.feed.close()


# ---------------------------------------------------------------- setup


def setup(recipe: Recipe, run_dir: Path) -> Training:
    """Everything training needs, in the order it must be made: the target's heads and (online in
    transformers) the target before the Accelerator, (online from vLLM) the producers after it, then
    `_setup_training`."""
    from accelerate.utils import set_seed

    tr = recipe.train
    out_dir = layout.stage_dir(run_dir, "train")
    # the target's embedding and lm_head, read once (2 x 1.2 GB for gpt-oss-120b); before the
    # Accelerator exists: under ZeRO-3 it makes transformers build every model (here the meta-device one
    # that names the tensors) partitioned
    heads = load_head_weights(recipe.target.model, recipe.target.trust_remote_code)
    state = process_state()
    index = read_index(run_dir / "capture")
    online = feed = None
    if index.get("mode") == "online" and index.get("backend", "hf") == "hf":  # the target runs here; loaded
        online = online_target(recipe, index["aux_layer_ids"], state.device)  # before the Accelerator too
    acc = make_accelerator(tr, out_dir)
    set_seed(tr.seed)
    if index.get("mode") == "online" and index.get("backend") == "vllm":  # producers: train/online_vllm.py
        feed = start_feed(recipe, run_dir, index, RegeneratedSequences(run_dir).lengths, acc)
    try:
        return _setup_training(recipe, run_dir, acc, heads, index, online, feed, out_dir)
    except BaseException:
        if feed is not None:
            feed.close()
        raise


def _setup_training(recipe, run_dir, acc, heads, index, online, feed, out_dir) -> Training:
    """setup's second half: the seeded draft, the data, the prepared module and optimizer."""
    tr = recipe.train

    draft = build_draft(recipe, run_dir, heads)
    trainable = draft.num_parameters()  # before prepare: ZeRO-3 partitions them
    sp = None
    if tr.sequence_parallel > 1:
        c = draft.config
        ulysses = kind_of(c).sp_splits_heads
        if ulysses:
            check_heads(tr.sequence_parallel, c.num_attention_heads, c.num_key_value_heads)
        sp = SequenceParallel.build(tr.sequence_parallel, tr.ttt_steps, acc.device.type, ulysses)
        if feed is not None:
            feed.sp = sp  # the group's first process asks vLLM for each row, the others get its states
    if compile_math(tr.compile, acc):
        draft.compile_math()
    # the target's lm_head turns stored final states into the teacher; a top-k capture needs none
    lm_head = heads["lm_head"].float() if index.get("teacher", "final") == "final" else torch.empty(0)
    module = TTTModule(
        draft,
        lm_head,
        tr.ttt_steps,
        tr.decay,
        tr.attention,
        tr.checkpoint_layer,
        tr.loss,
        sampled_at_t1(recipe.data),
        sp,
        kind_of(draft.config).forward,
        kind_of(draft.config).options(tr),
        kind_of(draft.config).rows,
    )
    if acc.is_fsdp2:
        configure_fsdp2(acc, draft)
    data = training_data(tr, run_dir, online, acc, feed, sp)
    total = tr.max_steps or max(1, math.ceil(tr.epochs * data.per_epoch))
    module, opt, sched, params = prepare(tr, acc, module, total)
    return Training(
        recipe, acc, module, opt, sched, params, draft.config, trainable, data, total, out_dir, feed, sp
    )


def online_target(recipe: Recipe, aux_layer_ids: list[int], device: torch.device) -> OnlineTarget:
    """`capture.mode: online`: the target (train/online.py's OnlineTarget), which adds its states to
    each micro-batch as capture would have stored them."""

    t = recipe.target
    c = recipe.capture
    check_fits(t, "set capture.backend: vllm (vLLM's producers make the states on their own GPUs)")
    return OnlineTarget(t.model, t.dtype, device, aux_layer_ids, c.dtype, c.batch_size, t.trust_remote_code)


def make_accelerator(tr: TrainSection, out_dir: Path) -> Accelerator:
    """The Accelerator for the launcher's choice (train/distributed.py) with the recipe's precision,
    accumulation, clipping, micro-batch rows and trackers."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    kwargs = accelerator_kwargs(tr.grad_accum, tr.grad_clip)
    # the buffers (the target's lm_head, 2.3 GB at gpt-oss size; the vocab maps) never change: DDP must
    # not re-send them from rank 0 before every forward
    kwargs["kwargs_handlers"].append(DistributedDataParallelKwargs(broadcast_buffers=False))
    acc = Accelerator(
        mixed_precision=mixed_precision(tr.mixed_precision),
        project_dir=str(out_dir),
        log_with=None if tr.report_to == "none" else tr.report_to,
        **kwargs,
    )
    if acc.state.deepspeed_plugin is not None:  # rows per micro-batch: the loader is ours, not prepared
        check_deepspeed(acc, tr.grad_accum)
        acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = tr.batch_size
    return acc


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A collated batch from the stored shards onto the device."""
    return {k: v.to(device) for k, v in batch.items()}


def training_data(
    tr: TrainSection,
    run_dir: Path,
    online: OnlineTarget | None,
    acc: Accelerator,
    feed: VllmFeed | None = None,
    sp: SequenceParallel | None = None,
) -> TrainData:
    """The stored sequences (or, online, the regenerated ones the target runs over: here (`online`) or in
    vLLM's producers (`feed`)), split into training rows (packed) and held-out validation sequences, dealt to
    this process (under sequence parallelism: to its group, each batch cut to this process's window)."""

    if online is not None or feed is not None:
        sequences = RegeneratedSequences(run_dir)
        stream = feed.stream if feed is not None else partial(map, online)
    else:
        sequences, stream = (
            ShardDataset(run_dir / "capture"),
            partial(map, partial(to_device, device=acc.device)),
        )
    train_ids, val_ids = held_out_split(tr, split_groups(tr, run_dir, len(sequences)))
    lengths = [sequences.lengths[i] for i in train_ids]
    if note := cut_note(lengths, tr.max_length):
        acc.print(f"[train] {note}")
    rows = plan_rows(lengths, tr.max_length, tr.pack, tr.seed, tr.pack_length)
    dataset = PackedRows(sequences, [[train_ids[i] for i in row] for row in rows])
    collate = partial(collate_rows, max_length=tr.max_length)
    # validation batches dealt to ranks like training's, padded so every rank runs as many forwards
    # (a wrapped module's forward may hold collectives: a rank with one batch fewer would hang the rest)
    if sp is not None:  # the rows whole until here (online: the target's states of the whole row)
        stream = partial(lambda s, b: map(sp.window, s(b)), stream)
    world, rank = (sp.dp_size, sp.dp_rank) if sp is not None else (acc.num_processes, acc.process_index)
    val_rows = PackedRows(sequences, [[i] for i in val_ids])
    val_lists = evaluation_micro_batches(len(val_ids), tr.batch_size, world, rank)

    def val_batches() -> Iterator[dict]:
        return stream(MicroBatches(val_rows, val_lists, collate))

    per_epoch = updates_per_epoch(len(dataset), tr.batch_size, tr.grad_accum, world)
    return TrainData(dataset, collate, stream, val_ids, val_batches, per_epoch)


def split_groups(tr: TrainSection, run_dir: Path, num_sequences: int) -> list[str]:
    """The conversation of each training sequence (data/splits.py), after checking that the run's vocab was
    counted without the tuning conversations this split holds out (a vocab from before splits were
    recorded is taken as it is)."""
    groups = run_groups(run_dir, num_sequences)
    counted = layout.read_done(run_dir, "vocab").get("split") if layout.is_done(run_dir, "vocab") else None
    if counted is not None and not same_split(counted, ours := split_record(tr, groups)):
        raise InputError(
            f"{run_dir / 'vocab'}: counted with the held-out split {counted}, but training holds out {ours}: "
            "set train.val_seed / train.val_fraction as the vocab stage had them, or re-run vocab"
        )
    return groups


def prepare(
    tr: TrainSection, acc: Accelerator, module: TTTModule, total: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR, list]:
    """The optimizer (train/optim.py) and the warmup + cosine schedule over `total` optimizer steps; the
    module and the optimizer prepared by accelerate, the schedule registered with it for the saved state
    -> (module, opt, sched, the prepared trainable parameters)."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if tr.optimizer == "muon" and acc.distributed_type.name in ("FSDP", "DEEPSPEED"):
        raise ValueError(
            f"train.optimizer=muon: Muon orthogonalizes whole matrices, which {acc.distributed_type.name} "
            "shards; train with DDP (or one process), or with train.optimizer=adamw"
        )
    opt = make_optimizer(
        tr.optimizer, named, tr.lr, tr.weight_decay, tr.muon_weight_decay, fused=acc.device.type == "cuda"
    )
    # stepped once per optimizer step by us: accelerate's prepared scheduler would step it once per process
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda(total, int(tr.warmup_ratio * total), tr.min_lr_ratio)
    )
    module, opt = acc.prepare(module, opt)
    params = [p for p in module.parameters() if p.requires_grad]  # FSDP2 replaced them (sharded DTensors)
    if acc.gradient_accumulation_steps != tr.grad_accum:
        raise ValueError(
            f"accelerate accumulates {acc.gradient_accumulation_steps} micro-batches per step, "
            f"the recipe train.grad_accum={tr.grad_accum}: the launcher's config must not set "
            "its own"
        )
    acc.register_for_checkpointing(sched)
    return module, opt, sched, params


def resume(t: Training) -> None:
    """Continue from the saved state if there is one (train/state.py): its step and tokens, and in `t.acc`
    the weights, optimizer, schedule and RNG; the log loses the lines of later steps (they are redone)."""
    saved = load_latest(t.acc, t.state_dir, t.layout)
    if saved is None:
        return
    t.resumed, t.step, t.tokens = saved, saved.step, saved.tokens
    t.acc.print(f"[train] resuming at step {t.step}/{t.total}")
    if t.acc.is_main_process and t.log_path.is_file():
        lines = t.log_path.read_text().splitlines()
        kept = [x for x in lines if x.strip() and json.loads(x)["step"] <= t.step]
        io.write_text(t.log_path, "".join(x + "\n" for x in kept))


def validation_missed(t: Training) -> bool:
    """A resumed run whose saved step was due a validation that its log lacks (it stopped during it)."""
    every = t.recipe.train.val_every
    if not (every and t.step and t.step % every == 0 and t.step < t.total and t.log_path.is_file()):
        return False
    lines = [json.loads(x) for x in t.log_path.read_text().splitlines() if x.strip()]
    return not any(x["step"] == t.step and "val" in x for x in lines)


# ---------------------------------------------------------------- the step loop


def train_steps(t: Training, progress: bool) -> None:
    """Optimizer steps from `t.step` to `t.total`, epoch after epoch (a resumed epoch skips the micro-batches
    it trained on). SIGINT / SIGTERM: the step is finished, the state saved, Interrupted raised
    (eyas/infra/interrupts.py)."""
    tr, acc = t.recipe.train, t.acc
    bar = tqdm(
        total=t.total, initial=t.step, desc="train (TTT)", disable=not (progress and acc.is_main_process)
    )
    epoch = t.step // t.data.per_epoch
    outs: list[TTTOutput] = []  # this optimizer step's TTT outputs (of its micro-batches but empty fillers)
    skip = (t.step % t.data.per_epoch) * tr.grad_accum  # this rank's micro-batches of a resumed epoch, done
    with StopRequest() as stop:
        t.module.train()
        try:
            while t.step < t.total:
                reseed(t, epoch)
                loader = epoch_loader(t, epoch, skip)
                skip = 0
                for batch in t.data.stream(loader):  # on the device (online: the target's states added)
                    out = micro_batch(t, batch)
                    n_tok = int(batch["lengths"].sum())
                    t.tokens += n_tok if t.sp is None or t.sp.rank == 0 else 0
                    if n_tok:
                        outs.append(out)
                    if not acc.sync_gradients:
                        continue
                    end_step(t, epoch, outs, bar, stop)
                    outs = []
                    if t.step >= t.total:
                        break
                epoch += 1
        except ProducerStopped as e:
            raise producer_stopped(t, e) from None
    bar.close()


def reseed(t: Training, epoch: int) -> None:
    """P-EAGLE's COD draws and DFlash's anchors (train/grids.py row_seeds) take the epoch: other anchors each
    pass over a row."""
    options = t.acc.unwrap_model(t.module).options
    for key in ("cod_seed", "anchor_seed"):
        if key in options:
            options[key] = (t.recipe.train.seed, epoch)


def producer_stopped(t: Training, e: Exception) -> Exception:
    """Online training from vLLM lost a producer mid-step: one process saves the state at the last finished
    step (the step it was on is redone on resume); several processes cannot all reach a save (the others
    wait in a collective), so they resume from the last saved state (train.save_every)."""
    if t.acc.num_processes == 1:
        t.save()
        return ProducerStopped(
            f"{e}; the training state at step {t.step}/{t.total} is saved: re-run to resume"
        )
    return ProducerStopped(f"{e}; re-run to resume from the last saved state (train.save_every)")


def epoch_loader(t: Training, epoch: int, skip: int) -> DataLoader:
    """This process's micro-batches of `epoch` after the first `skip` (torch DataLoader, train.num_workers
    workers that leave SIGINT / SIGTERM to this process)."""

    tr, d = t.recipe.train, t.data
    batches = epoch_micro_batches(len(d.dataset), tr.batch_size, tr.grad_accum, *t.dp, tr.seed, epoch)[skip:]
    return DataLoader(
        MicroBatches(d.dataset, batches, d.collate),
        batch_size=None,
        num_workers=tr.num_workers,
        worker_init_fn=ignore_in_worker if tr.num_workers else None,
    )


def micro_batch(t: Training, batch: dict[str, torch.Tensor]) -> TTTOutput:
    """One micro-batch's forward and backward -> its TTTOutput; on the last micro-batch of an optimizer step,
    the gradients are synced, clipped and stepped."""
    acc, clip = t.acc, t.recipe.train.grad_clip
    with acc.accumulate(t.module):
        out = t.module(**model_inputs(batch))
        acc.backward(out.loss)
        if acc.sync_gradients and clip > 0:
            acc.clip_grad_norm_(t.params, clip)
        t.opt.step()
        t.opt.zero_grad()
    return out


def end_step(t: Training, epoch: int, outs: list[TTTOutput], bar: tqdm, stop: StopRequest) -> None:
    """After an optimizer step (its micro-batches' TTT outputs `outs`): the schedule, the log, then, every
    process agreeing, validation, a save, or a stop on SIGINT / SIGTERM (Interrupted; the step is kept: a
    re-run resumes after it)."""
    tr, acc = t.recipe.train, t.acc
    t.sched.step()
    t.step += 1
    bar.update(1)
    t.last = {"step": t.step, "epoch": epoch, "lr": t.sched.get_last_lr()[0], **step_metrics(outs)}
    if t.step % tr.log_every == 0 or t.step == t.total:
        log_step(t, bar)
    everyone = partial(any_process, acc) if acc.num_processes > 1 else None
    stopping = t.step < t.total and stop.agreed(everyone)
    if tr.val_every and t.step % tr.val_every == 0 and t.step < t.total and not stopping:
        run_validation(t)
    if stopping or (tr.save_every and t.step % tr.save_every == 0 and t.step < t.total):
        t.save()
    if stopping:
        bar.close()
        acc.end_training()
        raise Interrupted(
            stop.signum, f"the training state at step {t.step}/{t.total} is saved in {t.state_dir}"
        )


def any_process(acc: Accelerator, flag: bool) -> bool:
    """Whether `flag` is set on any process (a collective, once per optimizer step)."""
    return sum_over_processes(acc, int(flag)) > 0


def log_step(t: Training, bar: tqdm) -> None:
    """The last step's metrics to the progress bar, log.jsonl (the main process) and the trackers."""
    last = t.last
    bar.set_postfix(
        loss=f"{last['loss']:.3f}",
        acc0=f"{(last['acc'] or [0.0])[0]:.2f}",
        tau_sim=f"{last['simulated_acceptance']:.2f}",
    )
    if t.acc.is_main_process:
        append_log(t.log_path, last)
    t.acc.log({"lr": last["lr"], **tracker_metrics(last, "train")}, step=t.step)


def run_validation(t: Training) -> dict | None:
    """The validation metrics at this step (every process runs it: collectives), logged; None with no
    held-out sequences."""
    if not t.data.val_ids:
        return None
    val = validate(t.module, t.data.val_batches(), t.acc, t.recipe.train.ttt_steps, t.sp)
    if t.acc.is_main_process:
        append_log(t.log_path, {"step": t.step, "val": val})
    t.acc.log(tracker_metrics(val, "val"), step=t.step)
    if t.recipe.train.keep_best:
        keep_if_best(t, val)
    return val


def best_score(val: dict, recipe: Recipe) -> tuple[str, float]:
    """What train.keep_best ranks validations by: the tuning split's tau at eval.k, replayed (the greedy
    loop's own rounds) where the answers are greedy text, else simulated at T = 1 -> (metric, value)."""
    metric = "replayed_tau" if float(recipe.data.temperature) == 0 else "simulated_tau_t1"
    return metric, val[metric][recipe.eval.k - 1]


def keep_if_best(t: Training, val: dict) -> None:
    """train.keep_best: the draft as it is now becomes RUN/train/checkpoint-best when this validation beats
    the best so far (a resumed run reads that from the kept checkpoint). Every process calls it (the same
    `val` on each: the weights are gathered when it wins)."""
    metric, score = best_score(val, t.recipe)
    path = t.out_dir.parent / layout.BEST_CHECKPOINT
    if t.best is None and layout.is_checkpoint(path):
        t.best = io.read_json(path / "config.json")["eyas"]["best"]
    if t.best is not None and score <= t.best["score"]:
        return
    t.best = {"step": t.step, "metric": metric, "k": t.recipe.eval.k, "score": score, "validation": val}
    write_draft(t, full_state_dict(t.acc, t.module), path, {"recipe": t.recipe.name, "best": t.best})
    t.acc.print(f"[train] step {t.step}: {metric} {score:.4f} at k={t.recipe.eval.k}, the best so far: kept")


def write_draft(t: Training, weights: dict, path: Path, extra: dict) -> None:
    """The gathered `weights` saved as a draft checkpoint at `path` (fp32) by the main process."""
    if not t.acc.is_main_process:
        return
    with torch.device("meta"):  # no second, initialised draft: it takes the gathered tensors as they are
        draft = make_draft(t.draft_config)
    draft.load_state_dict(
        {k[len("draft.") :]: v for k, v in weights.items() if k.startswith("draft.")}, assign=True
    )
    draft.rotary = Rotary(t.draft_config)
    save_draft(draft, path, dtype=torch.float32, extra=extra)


def append_log(log_path: Path, entry: dict) -> None:
    with open(log_path, "a") as f:
        f.write(json.dumps(entry) + "\n")


# ---------------------------------------------------------------- the end


def finish(t: Training, run_dir: Path) -> dict:
    """The last validation, the full weights gathered and the state saved (every process); checkpoint-final
    and curves.png (the main process); the trackers ended; DONE.json last -> the stage's info."""
    acc, tr = t.acc, t.recipe.train
    val = run_validation(t)
    # the full weights, gathered from every process (FSDP / ZeRO-3 keep them sharded): collective
    weights = full_state_dict(acc, t.module)
    tokens = sum_over_processes(acc, t.tokens)
    info = {
        "wall_s": round(time.perf_counter() - t.started, 2),  # this process's (a resumed run: its own part)
        "loop_s": round(t.loop_s, 2),  # this process's step loop alone, over tokens_this_run
        # the whole run's: every process's up to its last save (then redone), and its loops', over tokens_seen
        "run_wall_s": round(t.elapsed_s(), 2),
        "run_loop_s": round(t.run_loop_s(), 2),
        "steps": t.total,
        "epochs_seen": round(t.step / t.data.per_epoch, 3),
        "tokens_seen": tokens,
        "tokens_this_run": tokens - (t.resumed.tokens_all if t.resumed else 0),
        "trainable_parameters": t.trainable,
        "last": t.last,
        "mixed_precision": acc.mixed_precision,
        "num_processes": acc.num_processes,
        "sequence_parallel": tr.sequence_parallel,
        "global_batch_rows": t.dp[0] * tr.grad_accum * tr.batch_size,
        "validation": val,
        "val_sequences": len(t.data.val_ids),
        "best": t.best,  # train.keep_best: the run's draft is checkpoint-best
        "online": feed_stats(t.feed),  # from vLLM: micro-batches fed, how many training waited for
    }
    if t.feed is not None:  # what every process asked the producers for (each row once, also under SP)
        info["online"]["asked_all_processes"] = sum_over_processes(acc, t.feed.stats.asked)
    t.save()
    write_draft(t, weights, run_dir / layout.FINAL_CHECKPOINT, {"recipe": t.recipe.name, "train": info})
    if acc.is_main_process:
        from .curves import plot_curves  # lazy: matplotlib

        plot_curves(t.log_path, t.out_dir / "curves.png")
    acc.wait_for_everyone()
    acc.end_training()  # finishes the trackers, and ends the process group
    if acc.is_main_process:  # last: the trackers' files are complete, so the checksums hold
        layout.mark_done(run_dir, "train", info)
    return info
