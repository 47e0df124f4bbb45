"""The TTT trainer: accelerate (one process; DDP under `torchrun` or `accelerate launch`; FSDP2 and
DeepSpeed ZeRO-2/3 with the configs in recipes/accelerate/, see train/distributed.py), AdamW,
linear warmup + cosine decay, gradient clipping, bf16 autocast where the device has it.

Inputs: RUN/capture (shards of aux states + the teacher, vLLM layer ids; or, with `capture.mode:
online`, no shards: the target runs here, train/online.py), RUN/vocab (d2t, t2d).
Outputs: RUN/train/log.jsonl (per-step TTT metrics, and validation lines {"step", "val"}),
RUN/train/curves.png, RUN/train/state/ (optimizer, scheduler, RNG and step, for resuming),
RUN/train/checkpoint-final/ (the draft, EAGLE-3 format); `train.report_to` also sends the
metrics to wandb / tensorboard / trackio through accelerate's trackers.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from eyas import io, layout
from eyas.interrupts import Interrupted, StopRequest, ignore_in_worker
from eyas.recipes.schema import Recipe

from .checkpoint import load_draft, save_draft
from .distributed import accelerator_kwargs, check_deepspeed, configure_fsdp2, full_state_dict, process_state
from .model import DraftConfig, Eagle3Draft
from .packing import PackedRows, collate_rows, plan_rows
from .schedule import MicroBatches, epoch_micro_batches, evaluation_micro_batches, updates_per_epoch
from .ttt import TTTModule, model_inputs, simulated_tau
from .validation import split_validation, validate


def draft_config(recipe: Recipe, tcfg, aux_layer_ids: list[int], draft_vocab_size: int) -> DraftConfig:
    """The draft's shape: the target's text config with the recipe's `draft` overrides."""
    d = recipe.draft
    return DraftConfig.from_target_config(
        tcfg, aux_layer_ids, draft_vocab_size, target_model=recipe.target.model,
        intermediate_size=d.intermediate_size, num_attention_heads=d.num_attention_heads,
        num_key_value_heads=d.num_key_value_heads, head_dim=d.head_dim, rms_norm_eps=d.rms_norm_eps,
        norm_before_fc=d.norm_before_fc, norm_before_residual=d.norm_before_residual, num_layers=d.num_layers)


def build_draft(recipe: Recipe, run_dir: Path, embed: torch.Tensor) -> Eagle3Draft:
    """A fresh head sized from the target config, with the target's embedding `embed` (V, H)
    and the run's vocab map (or the warm-start checkpoint of `draft.init_from`)."""
    from eyas.data.shards import read_index
    from eyas.data.target import load_target_config, text_config

    index = read_index(run_dir / "capture")
    vocab = load_file(str(run_dir / "vocab" / "vocab.safetensors"))
    tcfg = text_config(load_target_config(recipe.target.model, recipe.target.trust_remote_code))
    cfg = draft_config(recipe, tcfg, index["aux_layer_ids"], int(vocab["d2t"].numel()))
    d = recipe.draft
    if d.init_from:
        draft = load_draft(d.init_from)
        keys = ("aux_layer_ids", "draft_vocab_size", "norm_before_fc", "norm_before_residual", "num_layers")
        differ = [k for k in keys if getattr(draft.config, k) != getattr(cfg, k)]
        if differ:
            raise ValueError(f"draft.init_from={d.init_from}: " + ", ".join(
                f"its {k} {getattr(draft.config, k)!r} != this run's {getattr(cfg, k)!r}" for k in differ))
        return draft
    torch.manual_seed(recipe.train.seed)
    draft = Eagle3Draft(cfg)
    draft.embed_tokens.weight.data.copy_(embed.float())
    draft.set_vocab_map(vocab["d2t"], vocab["t2d"])
    return draft


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
    else:
        out[f"{split}/simulated_tau"] = m["simulated_acceptance"]
    return out


def step_metrics(outs: list) -> dict:
    """One optimizer step's training metrics from its micro-batches' TTT outputs (this process):
    counts summed before dividing; the loss is the mean of the micro-batch losses."""
    if not outs:
        return {"loss": 0.0, "acc": [], "cond_acc": [], "step_loss": [], "simulated_acceptance": 1.0}
    steps = len(outs[0].step_count)
    tot = lambda f: [sum(getattr(o, f)[j] for o in outs) for j in range(steps)]  # noqa: E731
    n, right, base, cond = tot("step_count"), tot("step_right"), tot("step_cond_base"), tot("step_cond_right")
    cond_acc = [c / max(b, 1) for c, b in zip(cond, base)]
    return {"loss": sum(float(o.loss.detach()) for o in outs) / len(outs), "acc": [r / max(c, 1) for r, c in zip(right, n)],
            "cond_acc": cond_acc, "step_loss": [x / len(outs) for x in tot("step_loss")],
            "simulated_acceptance": simulated_tau(cond_acc)[-1] if cond_acc else 1.0}


def compile_math(setting: str, acc: Accelerator) -> bool:
    """train.compile: auto = on CUDA unless DeepSpeed ZeRO-3 partitions the weights (its hooks gather
    them per submodule, which a compiled graph would not see)."""
    plugin = acc.state.deepspeed_plugin
    zero3 = plugin is not None and plugin.zero_stage == 3
    if setting == "on" and zero3:
        raise ValueError("train.compile: on does not work under DeepSpeed ZeRO-3 (it gathers each submodule's "
                         "weights in hooks a compiled graph skips); use auto or off, or FSDP2 (fsdp2.yaml)")
    return setting == "on" or (setting == "auto" and acc.device.type == "cuda" and not zero3)


def mixed_precision(setting: str) -> str:
    if setting != "auto":
        return setting
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def run_train(recipe: Recipe, run_dir: str | Path, progress: bool = True) -> dict:
    """Train on this process's share of every global batch (train/schedule.py); under torchrun or
    `accelerate launch` every process runs this, and only the main process writes shared files."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, set_seed
    from torch.utils.data import DataLoader

    from eyas.data.shards import ShardDataset, read_index
    from eyas.data.target import load_head_weights

    run_dir = Path(run_dir)
    if layout.is_done(run_dir, "train"):
        return layout.read_done(run_dir, "train")
    t_start = time.perf_counter()
    tr = recipe.train
    out_dir = layout.stage_dir(run_dir, "train")
    # the target's embedding and lm_head, read once (2 x 1.2 GB for gpt-oss-120b); before the
    # Accelerator exists: under ZeRO-3 it makes transformers build every model (here the meta-device one
    # that names the tensors) partitioned
    heads = load_head_weights(recipe.target.model, recipe.target.trust_remote_code)
    state = process_state()
    online = None
    index = read_index(run_dir / "capture")
    if index.get("mode") == "online":  # the target runs here (train/online.py); loaded before the Accelerator too
        from .online import OnlineTarget, RegeneratedSequences

        t = recipe.target
        online = OnlineTarget(t.model, t.dtype, state.device, index["aux_layer_ids"], recipe.capture.dtype,
                              recipe.capture.batch_size, t.trust_remote_code)
    kwargs = accelerator_kwargs(tr.grad_accum, tr.grad_clip)
    # the buffers (the target's lm_head, 2.3 GB at gpt-oss size; the vocab maps) never change: DDP must
    # not re-send them from rank 0 before every forward
    kwargs["kwargs_handlers"].append(DistributedDataParallelKwargs(broadcast_buffers=False))
    acc = Accelerator(mixed_precision=mixed_precision(tr.mixed_precision), project_dir=str(out_dir),
                      log_with=None if tr.report_to == "none" else tr.report_to, **kwargs)
    if acc.state.deepspeed_plugin is not None:  # rows per micro-batch: the loader is ours, not prepared
        check_deepspeed(acc, tr.grad_accum)
        acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = tr.batch_size
    set_seed(tr.seed)
    world, rank = acc.num_processes, acc.process_index

    draft = build_draft(recipe, run_dir, heads["embed"])
    trainable = draft.num_parameters()  # before prepare: ZeRO-3 partitions them
    if compile_math(tr.compile, acc):
        draft.compile_math()
    # the target's lm_head turns stored final states into the teacher; a top-k capture needs none
    lm_head = heads["lm_head"].float() if index.get("teacher", "final") == "final" else torch.empty(0)
    module = TTTModule(draft, lm_head, tr.ttt_steps, tr.decay, tr.attention, tr.checkpoint_layer, tr.loss)
    if acc.is_fsdp2:
        configure_fsdp2(acc, draft)
    if online is not None:
        sequences, on_device = RegeneratedSequences(run_dir), online
    else:
        sequences = ShardDataset(run_dir / "capture")
        on_device = lambda batch: {k: v.to(acc.device) for k, v in batch.items()}  # noqa: E731
    train_ids, val_ids = split_validation(len(sequences), tr.val_fraction, tr.seed)
    rows = plan_rows([sequences.lengths[i] for i in train_ids], tr.max_length, tr.pack, tr.seed)
    dataset = PackedRows(sequences, [[train_ids[i] for i in row] for row in rows])
    collate = partial(collate_rows, max_length=tr.max_length)
    # validation batches dealt to ranks like training's, padded so every rank runs as many forwards
    # (a wrapped module's forward may hold collectives: a rank with one batch fewer would hang the rest)
    val_rows = PackedRows(sequences, [[i] for i in val_ids])
    val_lists = evaluation_micro_batches(len(val_ids), tr.batch_size, world, rank)
    val_batches = lambda: map(on_device, MicroBatches(val_rows, val_lists, collate))  # noqa: E731
    per_epoch = updates_per_epoch(len(dataset), tr.batch_size, tr.grad_accum, world)  # optimizer steps
    total = tr.max_steps or max(1, math.ceil(tr.epochs * per_epoch))
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tr.lr, weight_decay=tr.weight_decay, betas=(0.9, 0.95),
                            fused=acc.device.type == "cuda")  # one kernel per step on GPUs
    # stepped once per optimizer step by us: accelerate's prepared scheduler would step it once per process
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, int(tr.warmup_ratio * total), tr.min_lr_ratio))
    module, opt = acc.prepare(module, opt)
    params = [p for p in module.parameters() if p.requires_grad]  # FSDP2 replaced them (sharded DTensors)
    if acc.gradient_accumulation_steps != tr.grad_accum:
        raise ValueError(f"accelerate accumulates {acc.gradient_accumulation_steps} micro-batches per step, the "
                         f"recipe train.grad_accum={tr.grad_accum}: the launcher's config must not set its own")
    acc.register_for_checkpointing(sched)

    state_dir, log_path = out_dir / "state", out_dir / "log.jsonl"
    step, tokens = 0, 0
    if not (state_dir / "step.json").is_file() and (out_dir / "state.old" / "step.json").is_file():
        state_dir = out_dir / "state.old"  # killed between the two renames of save_state
    if (state_dir / "step.json").is_file():  # resume
        acc.load_state(str(state_dir))
        saved = json.loads((state_dir / "step.json").read_text())
        step = saved["step"]
        tokens = saved.get("tokens", 0) if acc.is_main_process else 0  # the count over all ranks, carried by one
        acc.print(f"[train] resuming at step {step}/{total}")
        if acc.is_main_process and log_path.is_file():  # drop lines of steps after the save: they are redone
            kept = [x for x in log_path.read_text().splitlines() if x.strip() and json.loads(x)["step"] <= step]
            io.write_text(log_path, "".join(x + "\n" for x in kept))
    state_dir = out_dir / "state"

    def tokens_seen() -> int:  # over all ranks (a collective)
        return int(acc.reduce(torch.tensor(tokens, device=acc.device), reduction="sum"))

    def save_state():
        """Every process writes its part (sharded optimizer state under FSDP / DeepSpeed) into a
        temporary directory; the main process renames it into place once all have finished."""
        tmp = out_dir / "state.tmp"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        try:
            acc.save_state(str(tmp))
        except Exception as e:
            full = io.disk_full(e, out_dir, tmp)
            if full:  # the last complete state stays; the partial one goes
                shutil.rmtree(tmp, ignore_errors=True)
                raise full from e
            raise
        seen = tokens_seen()
        if acc.is_main_process:
            (tmp / "step.json").write_text(json.dumps({"step": step, "tokens": seen}))
            old = out_dir / "state.old"
            shutil.rmtree(old, ignore_errors=True)
            if state_dir.exists():
                state_dir.rename(old)  # a kill from here on resumes from state.old
            tmp.rename(state_dir)
            shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()

    acc.init_trackers(recipe.name, config=flat_config(recipe.to_dict()),
                      init_kwargs={"wandb": {"dir": str(out_dir)}} if tr.report_to == "wandb" else {})

    def run_validation() -> dict | None:
        if not val_ids:
            return None
        val = validate(module, val_batches(), acc, tr.ttt_steps)
        if acc.is_main_process:
            with open(log_path, "a") as f:
                f.write(json.dumps({"step": step, "val": val}) + "\n")
        acc.log(tracker_metrics(val, "val"), step=step)
        return val

    def any_process(flag: bool) -> bool:  # a collective, once per optimizer step
        return bool(acc.reduce(torch.tensor(int(flag), device=acc.device), reduction="sum") > 0)

    bar = tqdm(total=total, initial=step, desc="train (TTT)", disable=not (progress and acc.is_main_process))
    epoch, last = step // per_epoch, {}
    step_outs = []  # this optimizer step's TTT outputs (its micro-batches that are not empty fillers)
    skip = (step % per_epoch) * tr.grad_accum  # this rank's micro-batches of the resumed epoch already trained on
    with StopRequest() as stop:  # SIGINT / SIGTERM: finish the step, save the state, exit (eyas/interrupts.py)
        module.train()
        while step < total:
            batches = epoch_micro_batches(len(dataset), tr.batch_size, tr.grad_accum, world, rank, tr.seed,
                                          epoch)[skip:]
            skip = 0
            loader = DataLoader(MicroBatches(dataset, batches, collate), batch_size=None, num_workers=tr.num_workers,
                                worker_init_fn=ignore_in_worker if tr.num_workers else None)
            for batch in loader:
                batch = on_device(batch)  # (online: the target's states added)
                with acc.accumulate(module):
                    out = module(**model_inputs(batch))
                    acc.backward(out.loss)
                    if acc.sync_gradients and tr.grad_clip > 0:
                        acc.clip_grad_norm_(params, tr.grad_clip)
                    opt.step()
                    opt.zero_grad()
                n_tok = int(batch["lengths"].sum())
                tokens += n_tok
                if n_tok:
                    step_outs.append(out)
                if not acc.sync_gradients:
                    continue
                sched.step()
                step += 1
                bar.update(1)
                last = {"step": step, "epoch": epoch, "lr": sched.get_last_lr()[0], **step_metrics(step_outs)}
                step_outs = []
                if step % tr.log_every == 0 or step == total:
                    bar.set_postfix(loss=f"{last['loss']:.3f}", acc0=f"{(last['acc'] or [0.0])[0]:.2f}",
                                    tau_sim=f"{last['simulated_acceptance']:.2f}")
                    if acc.is_main_process:
                        with open(log_path, "a") as f:
                            f.write(json.dumps(last) + "\n")
                    acc.log({"lr": last["lr"], **tracker_metrics(last, "train")}, step=step)
                stopping = step < total and stop.agreed(any_process if world > 1 else None)  # SIGINT / SIGTERM
                if tr.val_every and step % tr.val_every == 0 and step < total and not stopping:
                    run_validation()
                if stopping or (tr.save_every and step % tr.save_every == 0 and step < total):
                    save_state()
                if stopping:  # this step is kept: a re-run resumes after it
                    bar.close()
                    acc.end_training()
                    raise Interrupted(stop.signum, f"the training state at step {step}/{total} is saved in "
                                                   f"{state_dir}")
                if step >= total:
                    break
            epoch += 1
    bar.close()

    val = run_validation()
    # the full weights, gathered from every process (FSDP / ZeRO-3 keep them sharded): collective
    state = full_state_dict(acc, module)
    info = {
        "wall_s": round(time.perf_counter() - t_start, 2),
        "steps": total, "epochs_seen": round(step / per_epoch, 3), "tokens_seen": tokens_seen(),
        "trainable_parameters": trainable,
        "last": last, "mixed_precision": acc.mixed_precision, "num_processes": world,
        "global_batch_rows": world * tr.grad_accum * tr.batch_size,
        "validation": val, "val_sequences": len(val_ids),
    }
    save_state()
    if acc.is_main_process:
        from .curves import plot_curves

        final = Eagle3Draft(draft.config)
        final.load_state_dict({k[len("draft."):]: v for k, v in state.items() if k.startswith("draft.")})
        plot_curves(log_path, out_dir / "curves.png")
        save_draft(final, run_dir / layout.FINAL_CHECKPOINT, dtype=torch.float32,
                   extra={"recipe": recipe.name, "train": info})
    acc.wait_for_everyone()
    acc.end_training()  # finishes the trackers, and ends the process group
    if acc.is_main_process:  # last: the trackers' files are complete, so the checksums hold
        layout.mark_done(run_dir, "train", info)
    return info
