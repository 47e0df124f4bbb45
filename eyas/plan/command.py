"""`eyas plan RECIPE --gpus 8xH100`: what a recipe will cost, before anything runs.

Counts are exact: the target and the draft are built on the meta device from their configs
(for openai/gpt-oss-120b and -20b, a built-in copy of the hub config is used when the hub cannot
be reached). Memory and time are estimates from the assumptions of eyas/plan/cost.py, every one
printed with its source; `--run DIR` replaces the throughput assumptions with the rates a finished
(smaller) run measured in that directory.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eyas.data.regenerate import read_sequences
from eyas.data.target import TargetCount, count_target, stored_as_mxfp4
from eyas.infra.errors import as_input
from eyas.infra.io import read_jsonl
from eyas.infra.layout import RECIPE, is_done, read_done
from eyas.plan.cost import (
    CPU,
    Assumptions,
    DraftCount,
    Plan,
    allreduce,
    capture_bytes_per_token,
    count_draft,
    device_memory_gb,
    online_split,
    parse_gpus,
    shard_rows,
    target_config,
    target_replicas,
    teacher_bytes,
    throughputs,
    training_memory,
    unrolled_steps,
    vllm_replicas,
)
from eyas.plan.flops import capture_work, forward_cost, measured_flop_s
from eyas.plan.report import render
from eyas.plan.stage_memory import stage_memory
from eyas.plan.tokens import (
    TurnCount,
    combined,
    conversation_tokens,
    mixed_lengths,
    plan_tokenizer,
    source_samples,
    spread,
)
from eyas.plan.train_work import causal_pairs_per_token, train_cost, trained_pairs
from eyas.recipes.load import load_recipe, recipe_and_run
from eyas.train.kinds import kind_named
from eyas.train.sequence_parallel import check_heads

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from eyas.recipes.schema import Recipe

RUN_STAGES = ("prompts", "regenerate", "capture", "train")  # those of --run the plan counts or measures from


@dataclass
class Workload:
    """The data a plan is for, and the rates a finished run measured."""

    conversations: int | None  # None: every prompt of the sources, not known before the prompts stage
    sequences: float  # answered turns, one training sequence each
    prompt: float  # mean prompt tokens
    new: float  # mean generated tokens
    # regen_tok_s, capture_flop_s per replica, train_tok_s per GPU
    measured: dict[str, float] = field(default_factory=dict)
    # sequence lengths (tokens) distributed as the run's will be: --run's regenerated sequences, or its or
    # the sources' prompts + `new`; empty: every sequence `prompt + new` long
    lengths: list[float] = field(default_factory=list)
    turns: TurnCount | None = None  # counted from --run's prompts stage
    stages_measured: list[str] = field(default_factory=list)  # --run's finished stages
    # seconds of a stage outside its measured rate (vLLM's start, loading the target), as --run took them
    setup_s: dict[str, float] = field(default_factory=dict)
    unread: str = ""  # without --run, where no source could be read: each, and why
    # --run's training: (tokens, causal pairs) of the rows it trained (train_work.py), or None
    trained_pairs: tuple[int, float] | None = None


def time_outside_rate(done: dict, tokens: float | None, rate_key: str) -> float:
    """A finished stage's wall time beyond its tokens at its rate: starting vLLM, loading the target."""
    rate = done.get(rate_key)
    if not rate or tokens is None or done.get("wall_s") is None:
        return 0.0
    return max(done["wall_s"] - tokens / rate, 0.0)


def workload(
    recipe: Recipe, run_dir: str | Path | None, cfg: PretrainedConfig, a: Assumptions, target: TargetCount
) -> Workload:
    """The recipe's data with assumed lengths; with `run_dir`, what its finished stages counted (the
    prompts stage: turns and prompt lengths) and measured (regeneration, capture: lengths and rates;
    training: its rate) in their place. `target`: its parameters (capture's rate in FLOP/s: flops.py)."""

    d = recipe.data
    w = Workload(
        conversations=d.num_prompts,
        sequences=d.num_prompts or 0,
        prompt=min(a.mean_prompt_tokens, d.max_prompt_tokens),
        new=a.new_token_fraction * d.max_new_tokens,
    )
    gpt_oss = getattr(cfg, "model_type", "") == "gpt_oss"
    if run_dir is None:
        if d.num_prompts is None:  # how many prompts there are is the prompts stage's to count
            return w
        samples = source_samples(recipe)
        if any(x.rows for x in samples):
            _count_sources(recipe, w, samples, a, gpt_oss)
        else:
            w.unread = "; ".join(f"{x.label} not read: {x.why}" for x in samples)
        return w
    w.stages_measured = done = [s for s in RUN_STAGES if is_done(run_dir, s)]
    if not done:
        raise ValueError(
            f"--run {run_dir}: no finished stage there to count or measure from; run "
            f"`eyas prompts RECIPE --out {run_dir}` first (CPU only), or give a finished run"
        )
    if "regenerate" in done:
        regen = read_done(run_dir, "regenerate")
        w.new = regen["mean_generated_tokens"]
        # answered turns per prompt, over every prompt asked (one whose first turn was too long answers none)
        conversations = regen.get("num_prompts", regen.get("num_conversations", regen["num_sequences"]))
        w.conversations = w.conversations if w.conversations is not None else conversations
        w.sequences = w.conversations * regen["num_sequences"] / max(conversations, 1)
        # measured rates are per shard or per server (= per target replica)
        replicas_then = regen.get("num_servers") or len(regen.get("shards", [])) or 1
        w.measured["regen_tok_s"] = (regen.get("generation_tokens_per_s") or 0) / replicas_then
        w.setup_s["regenerate"] = time_outside_rate(
            regen, regen.get("generated_tokens_this_run"), "generation_tokens_per_s"
        )
        w.lengths = [len(s["input_ids"]) for s in read_sequences(run_dir)]
        w.prompt = max(sum(w.lengths) / max(len(w.lengths), 1) - w.new, 0.0)  # as capture will count them
    elif "prompts" in done:  # turns counted, prompts rendered; answers still assumed
        rows = read_jsonl(Path(run_dir) / "prompts" / "train.jsonl")
        if not rows:
            raise ValueError(f"--run {run_dir}: its prompts stage holds no training conversations")
        _count_turns(recipe, w, rows, a, gpt_oss)
    if "capture" in done:
        cap = read_done(run_dir, "capture")
        w.prompt = max(cap["num_tokens"] / cap["num_sequences"] - w.new, 0.0)
        w.measured["capture_flop_s"] = run_flop_s(recipe, run_dir, cap, w.lengths, cfg, target)
        w.setup_s["capture"] = time_outside_rate(cap, cap["num_tokens"], "tokens_per_s")
    if "train" in done:
        trained = read_done(run_dir, "train")
        loop_s = trained.get("loop_s") or trained["wall_s"]  # the step loop; setup (loading, compiling) apart
        # every process's loops over every token: a resumed run's loop_s is its last process's alone
        run_loop_s = trained.get("run_loop_s") or loop_s
        w.measured["train_tok_s"] = trained["tokens_seen"] / run_loop_s / trained.get("num_processes", 1)
        w.setup_s["train"] = max(trained["wall_s"] - loop_s, 0.0)
        try:
            seen = trained_pairs(recipe, run_dir, trained["steps"], trained.get("num_processes", 1))
        except Exception:  # noqa: BLE001  a capture since removed or redone: the rate stays per token
            seen = None
        w.trained_pairs = seen if seen and seen[0] == trained["tokens_seen"] > 0 else None  # else per token
    return w


def run_flop_s(
    recipe: Recipe, run_dir: str | Path, cap: dict, lengths: list, cfg: PretrainedConfig, target: TargetCount
) -> float:
    """The FLOP/s of --run's capture per shard (target replica): its forwards (eyas/plan/flops.py) over its
    sequences' `lengths` as it ran them (its recipe.yaml's capture section: batches, backend) in its
    shards, against the stage's tokens/s (`cap`, the stage record)."""
    if not cap.get("tokens_per_s"):
        return 0.0
    saved = Path(run_dir) / RECIPE
    c = load_recipe(saved).capture if saved.is_file() else recipe.capture
    work = capture_work(forward_cost(cfg, target, c), lengths, cap.get("capture_shards", 1))
    return measured_flop_s(work, cap["tokens_per_s"])


def _count_turns(recipe: Recipe, w: Workload, rows: list[dict], a: Assumptions, gpt_oss: bool):
    """w's sequences and mean prompt from the turns and lengths of --run's prompts stage (`rows`)."""
    harmony = a.kept_answer_fraction_harmony
    w.turns = conversation_tokens(recipe, rows, w.new, a.chars_per_token, harmony, gpt_oss)
    w.conversations = w.conversations if w.conversations is not None else w.turns.conversations
    w.sequences = w.conversations * w.turns.turns_per_conversation
    w.prompt = w.turns.mean_prompt
    w.lengths = [n + w.new for n in w.turns.prompt_lengths]


def _count_sources(recipe: Recipe, w: Workload, samples: list, a: Assumptions, gpt_oss: bool) -> None:
    """w's sequences and mean prompt from each source's sample priced apart and mixed by weight (a source
    not read: one turn of the assumed prompt, named in the plan)."""
    tok = plan_tokenizer(recipe)
    assumed = min(a.mean_prompt_tokens, recipe.data.max_prompt_tokens)
    parts, counts = [], []
    for x in samples:
        t = None
        if x.rows:
            try:
                t = conversation_tokens(
                    recipe, x.rows, w.new, a.chars_per_token, a.kept_answer_fraction_harmony, gpt_oss, tok
                )
            except ValueError as e:  # no prompt of this source fits data.max_prompt_tokens
                raise ValueError(f"data.prompts source {x.label}: {e}") from None
            counts.append(t)
        parts.append((x.weight, t))
    per_conversation, prompt = combined(parts, assumed)
    total = sum(x.weight for x in samples)
    unread = [f"{x.label} ({x.weight / total:.0%} of the prompts: {x.why})" for x in samples if not x.rows]
    streamed = [
        f"{x.label}: {x.streamed:,} records sampled from the hub (about {2 * x.streamed:,} streamed)"
        for x in samples
        if x.streamed
    ]
    w.turns = TurnCount(
        turns_per_conversation=per_conversation,
        mean_prompt=prompt,
        rendered=sum(t.rendered for t in counts),
        conversations=sum(t.conversations for t in counts),
        user_turns=sum(t.user_turns for t in counts),
        kept_answer_tokens=counts[0].kept_answer_tokens,
        no_tokenizer=counts[0].no_tokenizer,
        origin="a sample of each source, mixed by weight" + (f" ({'; '.join(streamed)})" if streamed else ""),
        unread=(f"priced at the assumed {assumed:.0f}-token prompt, one turn each: " + "; ".join(unread))
        if unread
        else "",
    )
    w.sequences, w.prompt = w.conversations * per_conversation, prompt
    w.lengths = [n + w.new for n in mixed_lengths(parts, assumed)]


def plan(recipe: Recipe, gpus: str, run_dir: str | Path | None = None, a: Assumptions | None = None) -> Plan:
    """The figures `eyas plan` prints (tests check them)."""
    a = a or Assumptions()
    n_gpu, kind = parse_gpus(gpus)
    mem_gb = device_memory_gb(kind)
    cfg, cfg_source = target_config(recipe)
    target, draft = count_target(cfg), count_draft(recipe, cfg)
    # a train.sequence_parallel that training would refuse, refused here first (one eyas: error: line)
    dc = draft.config
    if kind_named(recipe.draft.kind).sp_splits_heads:
        check_heads(recipe.train.sequence_parallel, dc.num_attention_heads, dc.num_key_value_heads)
    w = workload(recipe, run_dir, cfg, a, target)
    tokens = w.sequences * (w.prompt + w.new)
    bpt = capture_bytes_per_token(recipe, cfg, len(draft.config.aux_layer_ids))
    static, act = training_memory(recipe, cfg, draft, a, kind == CPU)
    replicas, per_replica, replica_fits = stage_replicas(recipe, cfg, target, n_gpu, mem_gb)
    regen_tok_s, flop_s, train_tok_s = throughputs(recipe, w.measured, a, kind, n_gpu, replicas)
    lengths = planned_lengths(w)
    # a shard per replica (one sequence: one shard)
    capture = capture_work(
        forward_cost(cfg, target, recipe.capture), lengths, replicas if len(lengths) > 1 else 1
    )
    train_tok_s = in_flops(recipe, w, draft, cfg, lengths, train_tok_s)
    capture_tok_s = capture.tokens / (max(capture.shard_flops) / (flop_s / replicas))  # the slowest shard's
    tr = recipe.train
    row = (tr.pack_length or tr.max_length) if tr.pack else min(tr.max_length, w.prompt + w.new)
    grads, allreduce_s = allreduce(draft.trainable, n_gpu, kind)
    tp = recipe.vllm.tensor_parallel_size
    trained = tr.epochs * tokens * (1 - tr.val_fraction)  # the tuning split's conversations are held out
    online = online_split(n_gpu, tp, capture_tok_s / replicas, train_tok_s / n_gpu, trained)
    longest, longest_from = longest_sequence(recipe, w, cfg)
    mem = stage_memory(recipe, cfg, target, draft, a, kind == CPU, tokens, longest)
    return Plan(
        gpus=f"{n_gpu}x{kind}",
        gpu_memory_gb=mem_gb,
        config_source=cfg_source,
        target=target,
        draft_trainable=draft.trainable,
        draft_frozen=draft.frozen,
        target_gb_per_gpu={
            "mxfp4": target.bytes_mxfp4 / n_gpu / 1e9,
            "bf16": target.bytes_bf16 / n_gpu / 1e9,
        },
        replica_fits=replica_fits,
        conversations=w.conversations,
        sequences=round(w.sequences),
        mean_tokens=w.prompt + w.new,
        tokens=tokens,
        capture_bytes_per_token=bpt,
        capture_bytes=bpt * tokens,
        train_static_gb=static / 1e9,
        train_activation_gb=act / 1e9,
        train_teacher_gb=teacher_bytes(draft, shard_rows(recipe.train)) / 1e9,
        train_gb_per_gpu=(static + act) / 1e9,
        regen_s=w.sequences * w.new / regen_tok_s + w.setup_s.get("regenerate", 0.0) if regen_tok_s else None,
        regen_tok_s=regen_tok_s,
        capture_s=tokens / capture_tok_s + w.setup_s.get("capture", 0.0),
        capture_tok_s=capture_tok_s,
        capture_flop_s=flop_s,
        capture_work=capture,
        replicas=replicas,
        gpus_per_replica=per_replica,
        train_s=trained / train_tok_s + w.setup_s.get("train", 0.0),
        train_tok_s=train_tok_s,
        measured=sorted(k for k, v in w.measured.items() if v),
        read_bytes_s=capture_bytes_per_token(recipe, cfg, len(draft.config.aux_layer_ids), True)
        * train_tok_s,
        allreduce_bytes=grads,
        allreduce_s=allreduce_s,
        step_s=n_gpu * tr.batch_size * tr.grad_accum * row / train_tok_s,
        online=online,
        process_bytes=mem.process,
        host_element=mem.element,
        capture_memory=mem.capture,
        capture_longest_from=longest_from,
        eval_memory=mem.eval,
        assumptions=a,
        turns=w.turns,
        stages_measured=w.stages_measured,
        setup_s=w.setup_s,
        unread=w.unread,
        train_in_flops=w.trained_pairs is not None,
    )


def stage_replicas(
    recipe: Recipe, cfg: PretrainedConfig, target: TargetCount, n_gpu: int, mem_gb: float
) -> tuple[int, int, bool]:
    """The target's replicas for regeneration and capture -> (replicas, GPUs each, whether a vLLM replica's
    weights fit): vLLM's (the vllm section; the checkpoint as stored) where a stage runs vLLM, else
    transformers' (target_replicas)."""
    vllm_held = target.bytes_mxfp4 if stored_as_mxfp4(cfg) else target.bytes_bf16
    replicas, per_replica, fits = vllm_replicas(recipe, vllm_held, n_gpu, mem_gb)
    if "vllm" not in (recipe.data.backend, recipe.capture.backend):
        replicas, per_replica = target_replicas(recipe, target, n_gpu, mem_gb)
    return replicas, per_replica, fits


def planned_lengths(w: Workload) -> list:
    """The planned run's sequence lengths: spread as `w.lengths` (each `prompt + new` where there are none;
    one such sequence where the count is not known)."""
    mean = w.prompt + w.new
    n = round(w.sequences)
    return list(spread(w.lengths or [mean], n, mean)) if n else [mean]


def longest_sequence(recipe: Recipe, w: Workload, cfg: PretrainedConfig) -> tuple[float, str]:
    """The longest sequence a capture batch holds: --run's regenerated ones, or (before a regeneration) the
    bound prompts and answers reach, data.max_prompt_tokens + data.max_new_tokens, at most the target's
    context -> (tokens, where they come from, as the report says it)."""
    if "regenerate" in w.stages_measured and w.lengths:
        return max(w.lengths), "--run's longest"
    bound = recipe.data.max_prompt_tokens + recipe.data.max_new_tokens
    return min(bound, getattr(cfg, "max_position_embeddings", None) or bound), (
        "data.max_prompt_tokens + data.max_new_tokens"
    )


def in_flops(
    recipe: Recipe, w: Workload, draft: DraftCount, cfg: PretrainedConfig, lengths: list, tok_s: float
) -> float:
    """Training's tokens/s on the planned sequences from --run's rate in FLOPs (train_work.py), where its
    trained rows could be counted; else `tok_s`, --run's per token (or the assumption)."""
    if w.trained_pairs is None:
        return tok_s
    cost = train_cost(recipe, draft, cfg, unrolled_steps(recipe))
    tokens, pairs = w.trained_pairs
    flop_s = tok_s * (cost.per_token + pairs / tokens * cost.per_pair)  # --run's rate, over every GPU
    return flop_s / (
        cost.per_token + causal_pairs_per_token(lengths, recipe.train.max_length) * cost.per_pair
    )


def main_plan(argv: list[str] | None = None) -> int:
    """`eyas plan RECIPE --gpus NxGPU [--run DIR] [overrides]`: prints the plan."""

    p = argparse.ArgumentParser(
        prog="eyas plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("recipe", help="recipe YAML or a shipped name (gpt-oss-120b, ...)")
    p.add_argument(
        "--gpus",
        required=True,
        help="NxGPU: H100, H200, B200 or A100 (80GB), e.g. 8xH100; or cpu (this machine, rates from --run)",
    )
    p.add_argument(
        "--run", help="a finished run directory whose measured rates replace the throughput assumptions"
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.max_length=32768")
    args = p.parse_intermixed_args(sys.argv[1:] if argv is None else argv)  # overrides before or after --gpus
    try:
        recipe, _ = recipe_and_run(args.recipe, None, args.overrides)
        print(render(recipe, plan(recipe, args.gpus, args.run)))
    except (ValueError, OSError) as e:
        raise as_input(e) from e
    return 0
