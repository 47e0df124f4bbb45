"""The text `eyas plan` prints from a `Plan`: the target and the draft, the data, capture storage, training
memory, target replicas and each stage's time, then every assumption the figures rest on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eyas.plan.cost import CPU, LOSS_CHUNK_BYTES, Plan, shard_buffer_bytes, unrolled_steps
from eyas.plan.tokens import TEMPLATE_TOKENS
from eyas.train.kinds import kind_named

if TYPE_CHECKING:
    from eyas.recipes.schema import Recipe


def sp_note(size: int) -> str:
    """' / P GPUs' where each row is spread over P GPUs (train.sequence_parallel)."""
    return f" / {size} GPUs (train.sequence_parallel)" if size > 1 else ""


def size(n_bytes: float) -> str:
    """'4.46 TB', '1.01 GB' or '12.3 MB': a small CPU run's capture reads 0.00 TB otherwise."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.2f} {unit}"
    return f"{n_bytes / 1e6:,.1f} MB"


def tokens(n: float) -> str:
    """'0.194B tokens' (gpt-oss's scale, as the docs quote it), '1.2M', '81.9K' or '640 tokens'."""
    if n >= 1e8:
        return f"{n / 1e9:,.3f}B tokens"
    if n >= 1e6:
        return f"{n / 1e6:,.1f}M tokens"
    return f"{n / 1e3:,.1f}K tokens" if n >= 1e4 else f"{n:,.0f} tokens"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def fits(p: Plan, gb: float) -> str:
    """Whether `gb` fits one of the plan's GPUs with 10% headroom."""
    return "fits" if gb <= p.gpu_memory_gb * 0.9 else "does NOT fit"


def source(p: Plan, rate: str) -> str:
    return "measured in --run" if rate in p.measured else "assumed"


FROZEN = {"target_frozen": "embedding and lm_head rows"}  # draft.lm_head -> what the draft holds frozen


def target_lines(recipe: Recipe, p: Plan) -> list[str]:
    """The plan's title, the target's size and where its weights go, the draft's size."""
    t, per_gpu = p.target, p.target_gb_per_gpu
    weights = (
        f"  weights: MXFP4 {t.bytes_mxfp4 / 1e9:,.1f} GB, bf16 {t.bytes_bf16 / 1e9:,.1f} GB; spread over the "
        f"GPUs (target.device_map: auto): {per_gpu['mxfp4']:,.1f} GB / {per_gpu['bf16']:,.1f} GB per GPU "
        f"({fits(p, per_gpu['mxfp4'])} / {fits(p, per_gpu['bf16'])} with 10% headroom)"
    )
    if t.expert_params == 0:  # no MoE experts: nothing is MXFP4
        cpu = p.gpus.endswith(CPU)
        fp32 = cpu and p.host_element == 4  # on a CPU, the dtype the target computes in
        name, gb = ("float32", t.params * 4 / 1e9) if fp32 else ("bf16", per_gpu["bf16"])
        where = "in the host's memory" if cpu else "spread over the GPUs (target.device_map: auto)"
        weights = (
            f"  weights: {name} {gb:,.1f} GB; {where}: {gb:,.1f} GB per "
            f"{'host' if cpu else 'GPU'} ({fits(p, gb)} with 10% headroom)"
        )
    return [
        f"plan for {recipe.name} on {p.gpus} ({p.gpu_memory_gb:,.0f} GB each"
        + ("; the host's memory, every rate measured in --run)" if p.gpus.endswith(CPU) else ")"),
        f"target {recipe.target.model} ({p.config_source}): {t.params / 1e9:,.2f}B parameters, "
        f"{t.expert_params / 1e9:,.2f}B of them MoE expert weights",
        weights,
        f"draft: {p.draft_trainable / 1e6:,.1f}M trainable, {p.draft_frozen / 1e6:,.1f}M frozen (the "
        f"target's {FROZEN.get(recipe.draft.lm_head, 'embedding')})",
    ]


def data_line(recipe: Recipe, p: Plan) -> str:
    """Sequences and tokens, and where they were counted."""
    t, total = p.turns, tokens(p.tokens)
    if p.conversations is None:
        return (
            "data: data.num_prompts is not set (every prompt of the sources), so the number of sequences "
            "is not known before the prompts stage: run `eyas prompts RECIPE --out RUN` (CPU, minutes) "
            "and pass --run RUN (the token, storage and time figures below are for 0 sequences)"
        )
    if t is not None:
        rendered = (
            f"prompts rendered for {t.rendered:,} of {t.conversations:,} conversations"
            if t.rendered
            else "prompt lengths estimated from their characters: " + t.no_tokenizer
        )
        unread = f"; {t.unread}" if t.unread else ""
        return (
            f"data: {p.conversations:,} conversations x {t.turns_per_conversation:.2f} answered turns "
            f"= {p.sequences:,} sequences x {p.mean_tokens:,.0f} tokens = {total} ({t.origin}: "
            f"{t.user_turns:,} user turns counted in {t.conversations:,} conversations, "
            f"{rendered}{unread}; answers assumed)"
        )
    how = "measured in --run" if "regenerate" in p.stages_measured else "assumed"
    unread = f"; {p.unread}" if p.unread else ""
    return f"data: {p.sequences:,} sequences x {p.mean_tokens:,.0f} tokens ({how} mean{unread}) = {total}"


OPTIMIZER_STATE = {"adamw": "AdamW", "muon": "Muon (AdamW on the rest)"}


def resource_lines(recipe: Recipe, p: Plan) -> list[str]:
    """Capture storage, training memory per GPU, the target's replicas, and each stage's time."""
    tr, backend, cpu = recipe.train, recipe.data.backend, p.gpus.endswith(CPU)
    return [
        f"capture: {p.capture_bytes_per_token:,} bytes/token ({recipe.capture.aux_format}, teacher "
        f"{recipe.capture.teacher}) = {size(p.capture_bytes)}" + buffer_note(recipe, p),
        f"training memory per GPU (DDP): {p.train_gb_per_gpu:,.1f} GB = {p.train_static_gb:,.1f} GB weights, "
        f"gradients, {OPTIMIZER_STATE[tr.optimizer]}, frozen weights, teacher lm_head + "
        f"{p.train_activation_gb:,.1f} GB activations (the teacher's {p.train_teacher_gb:,.1f} GB: fp32 over "
        f"{recipe.vocab.draft_vocab_size:,} draft ids) at "
        f"max_length {tr.max_length}{sp_note(tr.sequence_parallel)} x batch {tr.batch_size} "
        + steps_note(recipe)
        + f"{' (checkpoint_layer)' if tr.checkpoint_layer else ''}: {fits(p, p.train_gb_per_gpu)}",
        replicas_line(recipe, p),
        "memory of eyas's own process (a process's GPUs together; — where vLLM holds the target"
        + (
            f"; each stage it runs with the interpreter's {p.assumptions.cpu_process_bytes / 1e9:.1f} GB"
            if cpu
            else ""
        )
        + "): "
        + ", ".join(f"{k} {v / 1e9:,.1f} GB" if v else f"{k} —" for k, v in p.process_bytes.items()),
        *capture_line(p),
        eval_line(recipe, p),
        f"time: regeneration {hours(p.regen_s)} at {p.regen_tok_s:,.0f} tok/s ({source(p, 'regen_tok_s')}, "
        f"data.backend {backend}{engine_note(recipe, p)}){setup_note(p, 'regenerate')}, "
        f"capture {hours(p.capture_s)} at {p.capture_tok_s:,.0f} tok/s ({capture_note(recipe, p)})"
        f"{setup_note(p, 'capture')}, "
        f"training {hours(p.train_s)} for {tr.epochs} epoch(s) at {p.train_tok_s:,.0f} tok/s "
        f"({train_source(p)})"
        f"{setup_note(p, 'train')}",
    ]


def train_source(p: Plan) -> str:
    """Where training's rate comes from."""
    if p.train_in_flops:
        return "measured in --run, carried in FLOPs of its rows (draft steps, attention in a sequence)"
    return "measured in --run" if "train_tok_s" in p.measured else "from the H100 step measurement"


def capture_note(recipe: Recipe, p: Plan) -> str:
    """Where capture's rate comes from: the target's forward in FLOPs (eyas/plan/flops.py), its padding and
    its attention's share."""
    c, work = recipe.capture, p.capture_work
    per = p.capture_flop_s / p.replicas
    rate = f"{per / 1e12:,.1f} TFLOP/s" if per >= 1e12 else f"{per / 1e9:,.1f} GFLOP/s"
    rate += " a replica" if p.replicas > 1 else ""
    how = (
        f"batches of {c.batch_size} padded to their longest: "
        f"{work.run_tokens / work.tokens:.3f} tokens run a token"
        if c.backend == "hf"
        else "each sequence alone, causal"
    )
    return (
        f"the target's forward at {rate}, {source(p, 'capture_flop_s')}; {how}; attention "
        f"{work.attention / work.flops:.0%} of the FLOPs"
    )


def buffer_note(recipe: Recipe, p: Plan) -> str:
    """'; N GB of host memory for the shard it fills' for an offline capture."""
    if not p.capture_bytes:
        return ""
    tokens = p.capture_bytes / p.capture_bytes_per_token
    held = shard_buffer_bytes(recipe, p.capture_bytes_per_token, tokens)
    return f"; {size(held)} of host memory for the shard it fills (capture.shard_tokens)"


def setup_note(p: Plan, stage: str) -> str:
    """' (1.5 min of it to start, as in --run)' where --run's stage took time outside its rate."""
    t = p.setup_s.get(stage)
    return f" ({hours(t)} of it to start, as in --run)" if t else ""


def replicas_line(recipe: Recipe, p: Plan) -> str:
    """How many replicas of the target regenerate and capture, on how many GPUs each."""
    backends = (recipe.data.backend, recipe.capture.backend)
    if "vllm" in backends:
        used = " and ".join(
            f"{stage} ({key}.backend vllm)"
            for stage, key, b in zip(("regeneration", "capture"), ("data", "capture"), backends)
            if b == "vllm"
        )
        fit = "fits" if p.replica_fits else "does NOT fit: raise vllm.tensor_parallel_size"
        return (
            f"target replicas: {p.replicas} vLLM engine(s) of {p.gpus_per_replica} GPU(s) each (the vllm "
            f"section; the checkpoint as stored: {fit} with 10% headroom) for {used}"
        )
    return (
        f"target replicas: {p.replicas} of {p.gpus_per_replica} GPU(s) each "
        f"({'bf16' if recipe.target.weights == 'dequantized' else 'MXFP4'}, 10% headroom), one per "
        f"{'regeneration shard' if backends[0] == 'hf' else 'server of the fleet'} and per capture shard "
        f"(`eyas regenerate|capture --shard I/N`, or torchrun)"
    )


def limits_lines(recipe: Recipe, p: Plan) -> list[str]:
    """What limits a run on these GPUs: the storage offline training reads and how fast, the gradient
    all-reduce per step, the online alternative, and which of offline / online is faster."""
    tr, o = recipe.train, p.online
    per_token = p.read_bytes_s / p.train_tok_s  # an offline capture's bytes per token
    none = " (capture.mode: online stores none)" if recipe.capture.mode == "online" else ""
    lines = [
        f"storage: an offline capture {size(per_token * p.tokens)}{none}; offline training reads it "
        f"at {size(p.read_bytes_s)}/s ({per_token:,.0f} bytes/token at {p.train_tok_s:,.0f} tok/s)",
    ]
    if p.allreduce_s > 0:  # one process (a CPU, one GPU) all-reduces nothing
        lines.append(
            f"all-reduce (DDP): {p.allreduce_bytes / 1e9:,.2f} GB of fp32 gradients per optimizer step, "
            f"{p.allreduce_s * 1e3:,.1f} ms by ring over NVLink (datasheet bandwidth) against a "
            f"{p.step_s:,.2f} s step ({p.allreduce_s / p.step_s:.1%})"
        )
    if o is None:
        return lines
    offline_s = p.capture_s + p.train_s
    faster = "offline" if offline_s <= o.train_s else "online"
    given = f", given storage that reads {p.read_bytes_s / 1e9:,.2f} GB/s" if faster == "offline" else ""
    return lines + [
        f"online from vLLM (capture.mode: online, capture.backend: vllm): {o.producer_gpus} producer GPU(s) "
        f"(vllm.devices) : {o.trainer_gpus} trainer GPU(s), {o.tok_s:,.0f} tok/s: training "
        f"{hours(o.train_s)} for {tr.epochs} epoch(s) (the target's forward every epoch), nothing stored",
        f"offline or online on {p.gpus}: offline {hours(offline_s)} (capture {hours(p.capture_s)} + training "
        f"{hours(p.train_s)}), online {hours(o.train_s)}: {faster} is faster{given}",
    ]


def turns_assumption(recipe: Recipe, p: Plan) -> str:
    """How answered turns per prompt were counted, said in the assumptions."""
    if "regenerate" in p.stages_measured:
        return "answered turns per prompt as --run's regeneration answered them"
    if p.turns is not None:
        share = p.assumptions.kept_answer_fraction_harmony
        return (
            f"later turns' prompts hold each earlier answer as {p.turns.kept_answer_tokens:,.0f} tokens "
            f"(harmony templates keep the final channel: {share:.0%} of an answer; others all of it); "
            "every turn whose prompt fits data.max_prompt_tokens is counted as answered, though an "
            "answer cut at data.max_new_tokens ends its conversation (an upper bound)"
        )
    if recipe.data.max_turns == 1:
        return "one answered turn per prompt (data.max_turns: 1)"
    return (
        "one answered turn per prompt (multi-turn data adds a sequence per later turn, holding the "
        "conversation so far: run `eyas prompts RECIPE --out RUN` (CPU, minutes) and pass --run RUN to "
        "count them)"
    )


def activations_assumption(p: Plan) -> str:
    """The training activations' bytes the plan rests on: the H100's, or on a CPU the CPU's."""
    a = p.assumptions
    if p.gpus.endswith(CPU):
        return (
            f"activations {a.act_bytes_per_token_step_cpu / 1e3:.0f} KB per token per TTT step at "
            f"gpt-oss-120b's draft widths (float32, uncompiled; {a.cpu_bf16_act_ratio:.2f} of it under bf16 "
            "autocast; with checkpoint_layer at the H100's ratio; measured on a CPU: what autograd keeps), "
            "scaled by the draft's, the teacher apart, and the fused loss's chunk at its largest step ("
            + ", ".join(f"{n} {b} bytes a logit" for n, b in LOSS_CHUNK_BYTES.items())
            + "; P-EAGLE's and DFlash's gathered anchors with their teacher's copy; under bf16 the lm_head's "
            "copy)"
        )
    return (
        f"activations {a.act_bytes_per_token_step / 1e3:.0f} KB per token per TTT step, the teacher apart "
        f"({a.act_bytes_per_token_step_checkpointed / 1e3:.1f} KB with checkpoint_layer; H100-measured)"
    )


def assumption_lines(recipe: Recipe, p: Plan) -> list[str]:
    """The assumptions the figures rest on, each with its source."""
    a, turns = p.assumptions, p.turns
    rendered = (turns is not None and turns.rendered) or "capture" in p.stages_measured
    if rendered:
        prompt = ""
    elif turns is not None:
        prompt = f"prompts at {a.chars_per_token:g} characters a token, + {TEMPLATE_TOKENS} a message; "
    else:
        prompt = f"mean prompt {a.mean_prompt_tokens:.0f} tokens; "
    return [
        "assumptions (change them in eyas/plan/cost.py Assumptions, or pass --run DIR: a run's prompts stage "
        "counts the turns, its later stages give measured rates):",
        f"  {turns_assumption(recipe, p)}; {prompt}generated = {a.new_token_fraction:.2f} x "
        f"data.max_new_tokens; {activations_assumption(p)}",
        f"  training {a.train_tok_s_h100[0][1] / 1e3:.1f}K tok/s at T=4K, "
        f"{a.train_tok_s_h100[1][1] / 1e3:.1f}K at 32K per H100 (measured), scaled by bf16 FLOP/s for other "
        f"GPUs; capture at {a.capture_mfu:.0%} MFU of the target's forward (active parameters and attention) "
        "per replica; "
        f"regeneration per H100 replica {a.regen_tok_s_hf_h100:.0f} generated tok/s with HF generate, "
        f"{a.regen_tok_s_server_h100:,.0f} through a vLLM/SGLang server ({server_settings(recipe)}; neither "
        "measured by eyas at this size)"
        + (
            "; all-reduce at the datasheet NVLink bandwidth each way (what NCCL reaches at best)"
            if p.allreduce_s > 0
            else ""
        ),
    ]


def capture_line(p: Plan) -> list[str]:
    """An hf capture's memory in its parts (eyas/plan/capture_memory.py); none where vLLM captures."""
    m = p.capture_memory
    if m is None:
        return []
    shard = f" + the shard being filled {m.shard / 1e9:,.1f} GB" if m.shard else ""
    return [
        f"capture (transformers): weights {m.weights / 1e9:,.1f} GB{shard} + the larger of the first batch's "
        f"lm_head check {m.check / 1e9:,.1f} GB and the longest batch's forward ({m.rows} x {m.longest:,.0f} "
        f"tokens: {p.capture_longest_from}) {m.forward / 1e9:,.1f} GB"
    ]


def eval_line(recipe: Recipe, p: Plan) -> str:
    """eval's memory in its parts (eyas/plan/eval_memory.py)."""
    m, ev = p.eval_memory, recipe.eval
    return (
        f"eval (eyas's loop): {m.total / 1e9:,.1f} GB = weights {m.weights / 1e9:,.1f} GB + KV caches "
        f"{m.kv / 1e9:,.1f} GB ({m.rows} request(s) in flight x {m.context:,} tokens: the longest of "
        "data.max_prompt_tokens and train.max_length, + eval.max_new_tokens) + up to "
        f"{m.kv_growth / 1e9:,.1f} GB more while they grow for a longer request + activations "
        f"{m.activations / 1e9:,.1f} GB (a prefill forward of eval.prefill_tokens {ev.prefill_tokens:,} "
        f"against the whole context; attention blocks of {ev.attention_block_mb:,} MiB)"
    )


def engine_note(recipe: Recipe, p: Plan) -> str:
    """', CUDA graphs' where an assumed server rate is vLLM's with its CUDA graphs (eager: slower)."""
    if "regen_tok_s" in p.measured or recipe.data.backend == "hf":
        return ""
    return ", eager: slower than this" if recipe.vllm.enforce_eager else ", with CUDA graphs"


def server_settings(recipe: Recipe) -> str:
    """The engine settings the server regeneration rate assumes, and where the recipe runs otherwise."""
    eager = recipe.vllm.enforce_eager
    assumed = "CUDA graphs (vLLM's default on a GPU), ~128 requests in flight"
    return assumed + ("; vllm.enforce_eager: true runs without them, slower than this" if eager else "")


def render(recipe: Recipe, p: Plan) -> str:
    """The report, one figure a line."""
    return "\n".join(
        [
            *target_lines(recipe, p),
            data_line(recipe, p),
            *resource_lines(recipe, p),
            *limits_lines(recipe, p),
            *assumption_lines(recipe, p),
        ]
    )


def steps_note(recipe) -> str:
    """The training row's unrolled steps: EAGLE-3's TTT steps, P-EAGLE's depths at their COD shares plus
    the depths' attention and loss tensors on the whole grid, or DFlash's blocks plus its drafts' grids and
    the context's keys and values (eyas/plan/cost.py grid_bytes)."""

    return kind_named(recipe.draft.kind).plan_note(recipe.train, unrolled_steps(recipe))
