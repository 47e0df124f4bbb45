"""`eyas plan RECIPE --gpus 8xH100`: what a recipe will cost, before anything runs.

Counts are exact: the target and the draft are built on the meta device from their configs
(for openai/gpt-oss-120b and -20b, a built-in copy of the hub config is used when the hub cannot
be reached). Memory and time are estimates from the ASSUMPTIONS below, every one printed with
its source; `--run DIR` replaces the throughput assumptions with the rates a finished (smaller)
run measured in that directory.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from eyas.errors import as_input

# name: (memory GB, dense bf16 TFLOP/s) -- vendor datasheets (SXM parts)
GPUS = {"H100": (80, 989), "H200": (141, 989), "B200": (180, 2250), "A100": (80, 312)}

# the hub configs of the gpt-oss targets (openai/gpt-oss-120b, -20b config.json), for planning offline
KNOWN_TARGETS = {
    "openai/gpt-oss-120b": {"num_hidden_layers": 36, "num_local_experts": 128},
    "openai/gpt-oss-20b": {"num_hidden_layers": 24, "num_local_experts": 32},
}
GPT_OSS_SHARED = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, head_dim=64,
                      num_attention_heads=64, num_key_value_heads=8, num_experts_per_tok=4, sliding_window=128,
                      max_position_embeddings=131072, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "truncate": False, "original_max_position_embeddings": 4096,
                                       "rope_theta": 150000.0})

MXFP4_BYTES = 4.25 / 8  # e2m1 values (4 bits) + one e8m0 scale byte per 32


@dataclass
class Assumptions:
    """Every number the estimates rest on that is not counted from the recipe."""
    mean_prompt_tokens: float = 400.0  # rendered prompt, chat template included
    new_token_fraction: float = 0.75  # mean generated tokens / data.max_new_tokens (reasoning runs long)
    # multi-turn: the share of an earlier answer a later turn's prompt holds (gpt-oss's template keeps the
    # final channel and drops the analysis; other templates keep the whole answer: 1)
    kept_answer_fraction_harmony: float = 0.5
    # activation memory per token per TTT step, gpt-oss-120b draft dims, bf16, compiled norms/MLP, measured
    # on an H100 (README "Long sequences"): T=32K 60.5 GiB peak, T=64K with checkpoint_layer 38.0 GiB,
    # less the static part (weights, grads, AdamW, embedding, teacher lm_head) computed below
    act_bytes_per_token_step: float = 236e3
    act_bytes_per_token_step_checkpointed: float = 65.6e3
    # draft training tokens/s on one H100 at TTT 7, gpt-oss-120b draft dims (README): 22.3K at T=4K, 15.8K at 32K
    train_tok_s_h100: tuple = ((4096, 22.3e3), (32768, 15.8e3))
    capture_mfu: float = 0.30  # target forward (prefill) at 30% of peak bf16 FLOP/s on the GPU that runs it
    # regeneration, generated tokens/s per target replica on H100s -- assumed, not measured by eyas at this size:
    # HF generate (data.backend hf), and a vLLM/SGLang server with ~128 requests in flight (data.backend server)
    regen_tok_s_hf_h100: float = 100.0
    regen_tok_s_server_h100: float = 2000.0


def parse_gpus(text: str) -> tuple[int, str]:
    """"8xH100" -> (8, "H100"); "A100 80GB" / "A100-80GB" count as A100."""
    t = text.replace(" ", "").upper().replace("-80GB", "").replace("80GB", "")
    n, _, kind = t.partition("X") if "X" in t else ("1", "", t)
    if not n.isdigit() or int(n) < 1 or kind not in GPUS:
        raise ValueError(f"--gpus {text!r}: expected NxGPU with GPU one of {', '.join(GPUS)} (e.g. 8xH100)")
    return int(n), kind


def target_config(recipe):
    from eyas.data.target import load_target_config

    name = recipe.target.model
    if name not in KNOWN_TARGETS:
        return load_target_config(name, recipe.target.trust_remote_code), "its config.json"
    from transformers import AutoConfig, GptOssConfig

    try:  # a local copy (hub cache or directory) when there is one; the hub is not asked
        return AutoConfig.from_pretrained(name, local_files_only=True), "its config.json (local copy)"
    except OSError:
        return GptOssConfig(**GPT_OSS_SHARED, **KNOWN_TARGETS[name]), "eyas's built-in copy of its hub config"


def count_target(cfg) -> dict:
    """Parameters of the target, built on the meta device: total, MoE experts' weight matrices (what
    gpt-oss stores in MXFP4), and bytes in MXFP4 and in bf16."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    total = experts = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if ".experts." in name and not name.endswith("_bias") and p.dim() == 3:
            experts += p.numel()
    mxfp4 = experts * MXFP4_BYTES + (total - experts) * 2
    return {"params": total, "expert_params": experts, "bytes_mxfp4": mxfp4, "bytes_bf16": 2 * total}


def count_draft(recipe, cfg) -> dict:
    from eyas.data.target import text_config
    from eyas.recipes.schema import check_against_target
    from eyas.train.model import Eagle3Draft
    from eyas.train.trainer import draft_config

    tcfg = text_config(cfg)
    ids = check_against_target(recipe, tcfg.num_hidden_layers, tcfg.vocab_size)
    dcfg = draft_config(recipe, tcfg, ids, min(recipe.vocab.draft_vocab_size, tcfg.vocab_size))
    with torch.device("meta"):
        draft = Eagle3Draft(dcfg)
    return {"trainable": draft.num_parameters(), "frozen": draft.num_parameters(False) - draft.num_parameters(),
            "config": dcfg}


SAMPLED_CONVERSATIONS = 2000  # conversations of the prompts stage rendered to measure prompt lengths


def turn_prompt_lengths(tok, system: list[dict], users: list[dict], kept: list[float], limit: int,
                        **template_kwargs) -> list[float]:
    """The prompt length of each turn of one conversation as regeneration renders it, before any answer
    exists: the chat template around the conversation so far with every earlier answer empty, plus
    `kept[i]` tokens for earlier answer i (the part of it the template keeps). Stops before the first
    turn longer than `limit` (data.max_prompt_tokens), which regeneration does not ask."""
    from eyas.data.chat import render_prompt

    lengths, context = [], list(system)
    for t, user in enumerate(users):
        context = context + [user]
        n = len(render_prompt(tok, context, **template_kwargs)) + sum(kept[:t])
        if n > limit:
            break
        lengths.append(n)
        context = context + [{"role": "assistant", "content": ""}]
    return lengths


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def plan_tokenizer(recipe) -> tuple[object | None, str]:
    """The target's tokenizer for rendering prompts (a few MB): from a local copy or the hub cache first,
    then the hub. -> (tokenizer, "") or (None, why it cannot be used and how to get one that can)."""
    from eyas.data.target import resolve_path
    from transformers import AutoTokenizer

    name = resolve_path(recipe.target.model)
    errors = []
    for local in (True, False):
        try:
            tok = AutoTokenizer.from_pretrained(name, trust_remote_code=recipe.target.trust_remote_code,
                                                local_files_only=local)
        except (OSError, ValueError) as e:
            errors.append(str(e).splitlines()[0] if str(e) else type(e).__name__)
            continue
        if tok.chat_template:
            return tok, ""
        errors.append("it has no chat template")
        break
    fix = (f"put the model's tokenizer files (tokenizer.json, tokenizer_config.json, its chat template) in {name}"
           if Path(name).is_dir() else
           f"fetch only its tokenizer files where there is network: `hf download {recipe.target.model} "
           f"{' '.join(TOKENIZER_FILES)}`")
    return None, (f"the tokenizer of {recipe.target.model} could not be used ({errors[-1]}); to render the "
                  f"prompts, {fix}")


def conversation_tokens(recipe, run_dir: Path, new: float, a: Assumptions, is_gpt_oss: bool) -> dict:
    """Answered turns and prompt lengths from a run whose prompts stage is done (CPU only, before any GPU).

    Every training conversation's user turns are counted (at most data.max_turns); a seeded sample of
    the conversations (all of them up to SAMPLED_CONVERSATIONS) is rendered with the target's chat
    template as regeneration renders it, turn by turn, with each prompt's reasoning effort, every earlier
    answer standing in as `new` generated tokens of which the template keeps a share (a harmony template:
    the final channel). A conversation stops where regeneration stops it at a prompt over
    data.max_prompt_tokens; the share of turns that fit in the sample scales the count. An answer cut at
    data.max_new_tokens also ends its conversation in regeneration: not modelled, so the count is an
    upper bound. Without a tokenizer the turns are still counted and the prompt length is assumed.
    -> {"turns_per_conversation", "mean_prompt", "rendered", "conversations", "user_turns",
        "kept_answer_tokens", "no_tokenizer"}."""
    import random

    from eyas.data.chat import effort_kwargs, is_harmony, reasoning_effort, split_turns
    from eyas.io import read_jsonl

    d = recipe.data
    rows = read_jsonl(Path(run_dir) / "prompts" / "train.jsonl")
    if not rows:
        raise ValueError(f"--run {run_dir}: its prompts stage holds no training conversations")
    turns = [split_turns(r["messages"]) for r in rows]
    if d.max_turns is not None:  # a recipe that asks fewer turns than the run's prompts stage kept
        turns = [(system, users[:d.max_turns]) for system, users in turns]
    user_turns = sum(len(users) for _, users in turns)
    tok, why = plan_tokenizer(recipe)
    harmony = is_harmony(tok) if tok is not None else is_gpt_oss
    kept = new * (a.kept_answer_fraction_harmony if harmony else 1.0)
    picked = random.Random(d.seed).sample(range(len(rows)), min(len(rows), SAMPLED_CONVERSATIONS))
    asked, sampled_turns, prompt_tokens = 0, 0, 0.0
    for i in picked:
        system, users = turns[i]
        if tok is None:  # the first turn's prompt assumed, each later one holding the earlier answers' kept part
            first, lengths = min(a.mean_prompt_tokens, d.max_prompt_tokens), []
            for t in range(len(users)):
                if first + t * kept > d.max_prompt_tokens:
                    break
                lengths.append(first + t * kept)
        else:
            effort = effort_kwargs(reasoning_effort(d.reasoning_effort, d.seed, rows[i]["id"]))
            lengths = turn_prompt_lengths(tok, system, users, [kept] * len(users), d.max_prompt_tokens, **effort)
        asked, sampled_turns, prompt_tokens = asked + len(lengths), sampled_turns + len(users), prompt_tokens + sum(lengths)
    if not asked:
        raise ValueError(f"data.max_prompt_tokens={d.max_prompt_tokens}: no first prompt of the {len(picked):,} "
                         "conversations rendered fits under it, so regeneration would answer none; raise it")
    return {"turns_per_conversation": user_turns / len(rows) * asked / sampled_turns,
            "mean_prompt": prompt_tokens / asked, "rendered": 0 if tok is None else len(picked),
            "conversations": len(rows), "user_turns": user_turns, "kept_answer_tokens": kept, "no_tokenizer": why}


def train_tok_s_h100(T: int, a: Assumptions) -> float:
    """Log-linear in T between the two measured lengths (held flat outside them)."""
    (t0, r0), (t1, r1) = a.train_tok_s_h100
    x = min(max(math.log(T), math.log(t0)), math.log(t1))
    return r0 + (r1 - r0) * (x - math.log(t0)) / (math.log(t1) - math.log(t0))


def hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def plan(recipe, gpus: str, run_dir: str | Path | None = None, a: Assumptions | None = None) -> dict:
    """The figures `eyas plan` prints, as a dict (tests check them)."""
    from eyas.data.compact import bytes_per_token
    from eyas.layout import is_done, read_done

    a = a or Assumptions()
    n_gpu, kind = parse_gpus(gpus)
    mem_gb, tflops = GPUS[kind]
    cfg, cfg_source = target_config(recipe)
    tgt, dr = count_target(cfg), count_draft(recipe, cfg)
    d, c, tr = recipe.data, recipe.capture, recipe.train
    n_aux = len(dr["config"].aux_layer_ids)

    # tokens
    n_conv = d.num_prompts  # conversations (prompts); None: every prompt of the sources, not known before the prompts stage
    n_seq = n_conv or 0
    new = a.new_token_fraction * d.max_new_tokens
    prompt = min(a.mean_prompt_tokens, d.max_prompt_tokens)
    measured, turns = {}, None
    done = (lambda stage: is_done(run_dir, stage)) if run_dir is not None else (lambda stage: False)
    if run_dir is not None and not any(done(s) for s in ("prompts", "regenerate", "capture", "train")):
        raise ValueError(f"--run {run_dir}: no finished stage there to count or measure from; run "
                         f"`eyas prompts RECIPE --out {run_dir}` first (CPU only), or give a finished run")
    if done("regenerate"):
        regen = read_done(run_dir, "regenerate")
        new = regen["mean_generated_tokens"]
        # answered turns per prompt, over every prompt asked (one whose first turn was too long answers none)
        conversations = regen.get("num_prompts", regen.get("num_conversations", regen["num_sequences"]))
        n_conv = n_conv if n_conv is not None else conversations
        n_seq = n_conv * regen["num_sequences"] / max(conversations, 1)
        # measured rates are per shard or per server (= per target replica)
        replicas_then = regen.get("num_servers") or len(regen.get("shards", [])) or 1
        measured["regen_tok_s"] = (regen.get("generation_tokens_per_s") or 0) / replicas_then
    elif done("prompts"):  # turns counted, prompts rendered; answers still assumed
        turns = conversation_tokens(recipe, run_dir, new, a, getattr(cfg, "model_type", "") == "gpt_oss")
        n_conv = n_conv if n_conv is not None else turns["conversations"]
        n_seq = n_conv * turns["turns_per_conversation"]
        prompt = turns["mean_prompt"]
    if done("capture"):
        cap = read_done(run_dir, "capture")
        prompt = max(cap["num_tokens"] / cap["num_sequences"] - new, 0.0)
        measured["capture_tok_s"] = (cap.get("tokens_per_s") or 0) / cap.get("capture_shards", 1)
    if done("train"):
        trained = read_done(run_dir, "train")
        measured["train_tok_s"] = trained["tokens_seen"] / trained["wall_s"] / trained.get("num_processes", 1)
    tokens = n_seq * (prompt + new)

    # capture storage
    dtype_bytes = 4 if c.dtype == "float32" else 2
    bpt = 0 if c.mode == "online" else bytes_per_token(n_aux, cfg.hidden_size, c.aux_format, c.teacher,
                                                       c.teacher_topk, dtype_bytes)

    # draft training memory per GPU (DDP: everything replicated)
    static = 16 * dr["trainable"] + 4 * dr["frozen"] + (4 * cfg.vocab_size * cfg.hidden_size
                                                       if c.teacher == "final" else 0)
    per_ts = a.act_bytes_per_token_step_checkpointed if tr.checkpoint_layer else a.act_bytes_per_token_step
    scale = (2 * dr["config"].hidden_size + dr["config"].intermediate_size) / (2 * 2880 + 17280)
    act = per_ts * scale * tr.max_length * tr.batch_size * tr.ttt_steps
    train_mem = static + act

    # times
    flops_per_token = 2 * (tgt["params"] - tgt["expert_params"]
                           + tgt["expert_params"] * getattr(cfg, "num_experts_per_tok", 1)
                           / max(getattr(cfg, "num_local_experts", 1), 1))
    # regeneration and capture run one shard per replica of the target (data/sharding.py)
    held = tgt["bytes_bf16"] if recipe.target.weights == "dequantized" else tgt["bytes_mxfp4"]
    per_replica = math.ceil(held / (0.9 * mem_gb * 1e9))
    replicas = max(1, n_gpu // per_replica)
    capture_tok_s = (measured.get("capture_tok_s") or a.capture_mfu * tflops * 1e12 / flops_per_token) * replicas
    gpu_scale = tflops / GPUS["H100"][1]
    regen_rate = a.regen_tok_s_server_h100 if d.backend == "server" else a.regen_tok_s_hf_h100
    regen_tok_s = (measured.get("regen_tok_s") or gpu_scale * regen_rate) * replicas
    train_tok_s = (measured.get("train_tok_s") or gpu_scale * train_tok_s_h100(tr.max_length, a)
                   * 7 / tr.ttt_steps) * n_gpu
    return {
        "gpus": f"{n_gpu}x{kind}", "gpu_memory_gb": mem_gb, "config_source": cfg_source,
        "target": tgt, "draft_trainable": dr["trainable"], "draft_frozen": dr["frozen"],
        "target_gb_per_gpu": {"mxfp4": tgt["bytes_mxfp4"] / n_gpu / 1e9, "bf16": tgt["bytes_bf16"] / n_gpu / 1e9},
        "conversations": n_conv, "sequences": round(n_seq), "mean_tokens": prompt + new, "tokens": tokens,
        "capture_bytes_per_token": bpt, "capture_bytes": bpt * tokens,
        "train_static_gb": static / 1e9, "train_activation_gb": act / 1e9, "train_gb_per_gpu": train_mem / 1e9,
        "regen_s": n_seq * new / regen_tok_s if regen_tok_s else None, "regen_tok_s": regen_tok_s,
        "capture_s": tokens / capture_tok_s, "capture_tok_s": capture_tok_s,
        "replicas": replicas, "gpus_per_replica": per_replica,
        "train_s": tr.epochs * tokens / train_tok_s, "train_tok_s": train_tok_s,
        "measured": sorted(k for k, v in measured.items() if v), "assumptions": a, "turns": turns,
        "stages_measured": [s for s in ("prompts", "regenerate", "capture", "train") if done(s)],
    }


def data_line(recipe, p: dict) -> str:
    t, total = p["turns"], f"{p['tokens'] / 1e9:,.3f}B tokens"
    if p["conversations"] is None:
        return ("data: data.num_prompts is not set (every prompt of the sources), so the number of sequences is not "
                "known before the prompts stage: run `eyas prompts RECIPE --out RUN` (CPU, minutes) and pass --run RUN "
                "(the token, storage and time figures below are for 0 sequences)")
    if t is not None:
        rendered = (f"prompts rendered for {t['rendered']:,} of {t['conversations']:,} conversations" if t["rendered"]
                    else "prompt lengths assumed: " + t["no_tokenizer"])
        return (f"data: {p['conversations']:,} conversations x {t['turns_per_conversation']:.2f} answered turns "
                f"= {p['sequences']:,} sequences x {p['mean_tokens']:,.0f} tokens = {total} (--run's prompts stage: "
                f"{t['user_turns']:,} user turns counted in {t['conversations']:,} conversations, {rendered}; "
                "answers assumed)")
    how = "measured in --run" if "regenerate" in p["stages_measured"] else "assumed"
    return f"data: {p['sequences']:,} sequences x {p['mean_tokens']:,.0f} tokens ({how} mean) = {total}"


def turns_assumption(recipe, p: dict) -> str:
    """How answered turns per prompt were counted, said in the assumptions."""
    if "regenerate" in p["stages_measured"]:
        return "answered turns per prompt as --run's regeneration answered them"
    if p["turns"] is not None:
        return (f"later turns' prompts hold each earlier answer as {p['turns']['kept_answer_tokens']:,.0f} tokens "
                f"(harmony templates keep the final channel: {p['assumptions'].kept_answer_fraction_harmony:.0%} of "
                "an answer; others all of it); every turn whose prompt fits data.max_prompt_tokens is counted as "
                "answered, though an answer cut at data.max_new_tokens ends its conversation (an upper bound)")
    if recipe.data.max_turns == 1:
        return "one answered turn per prompt (data.max_turns: 1)"
    return ("one answered turn per prompt (multi-turn data adds a sequence per later turn, holding the conversation "
            "so far: run `eyas prompts RECIPE --out RUN` (CPU, minutes) and pass --run RUN to count them)")


def render(recipe, p: dict) -> str:
    t, a = p["target"], p["assumptions"]
    fits = lambda gb: "fits" if gb <= p["gpu_memory_gb"] * 0.9 else "does NOT fit"  # noqa: E731
    src = lambda key: "measured in --run" if key in p["measured"] else "assumed"  # noqa: E731
    lines = [
        f"plan for {recipe.name} on {p['gpus']} ({p['gpu_memory_gb']} GB each)",
        f"target {recipe.target.model} ({p['config_source']}): {t['params'] / 1e9:,.2f}B parameters, "
        f"{t['expert_params'] / 1e9:,.2f}B of them MoE expert weights",
        f"  weights: MXFP4 {t['bytes_mxfp4'] / 1e9:,.1f} GB, bf16 {t['bytes_bf16'] / 1e9:,.1f} GB; spread over the "
        f"GPUs (target.device_map: auto): {p['target_gb_per_gpu']['mxfp4']:,.1f} GB / "
        f"{p['target_gb_per_gpu']['bf16']:,.1f} GB per GPU ({fits(p['target_gb_per_gpu']['mxfp4'])} / "
        f"{fits(p['target_gb_per_gpu']['bf16'])} with 10% headroom)",
        f"draft: {p['draft_trainable'] / 1e6:,.1f}M trainable, {p['draft_frozen'] / 1e6:,.1f}M frozen (the target's "
        f"embedding)",
        data_line(recipe, p),
        f"capture: {p['capture_bytes_per_token']:,} bytes/token ({recipe.capture.aux_format}, teacher "
        f"{recipe.capture.teacher}) = {p['capture_bytes'] / 1e12:,.2f} TB",
        f"training memory per GPU (DDP): {p['train_gb_per_gpu']:,.1f} GB = {p['train_static_gb']:,.1f} GB weights, "
        f"gradients, AdamW, embedding, teacher lm_head + {p['train_activation_gb']:,.1f} GB activations at "
        f"max_length {recipe.train.max_length} x batch {recipe.train.batch_size} x TTT {recipe.train.ttt_steps}"
        f"{' (checkpoint_layer)' if recipe.train.checkpoint_layer else ''}: {fits(p['train_gb_per_gpu'])}",
        f"target replicas: {p['replicas']} of {p['gpus_per_replica']} GPU(s) each "
        f"({'bf16' if recipe.target.weights == 'dequantized' else 'MXFP4'}, 10% headroom), one per "
        f"{'server of the fleet' if recipe.data.backend == 'server' else 'regeneration shard'} and per capture shard "
        f"(`eyas regenerate|capture --shard I/N`, or torchrun)",
        f"time: regeneration {hours(p['regen_s'])} at {p['regen_tok_s']:,.0f} tok/s ({src('regen_tok_s')}, "
        f"data.backend {recipe.data.backend}), "
        f"capture {hours(p['capture_s'])} at {p['capture_tok_s']:,.0f} tok/s ({src('capture_tok_s')}), "
        f"training {hours(p['train_s'])} for {recipe.train.epochs} epoch(s) at {p['train_tok_s']:,.0f} tok/s "
        f"({'measured in --run' if 'train_tok_s' in p['measured'] else 'from the H100 step measurement'})",
        "assumptions (change them in eyas/plan.py Assumptions, or pass --run DIR: a run's prompts stage counts the "
        "turns, its later stages give measured rates):",
        f"  {turns_assumption(recipe, p)}; "
        + ("" if (p["turns"] is not None and p["turns"]["rendered"]) or "capture" in p["stages_measured"] else
           f"mean {'first-turn ' if p['turns'] is not None else ''}prompt {a.mean_prompt_tokens:.0f} tokens; ")
        + f"generated = {a.new_token_fraction:.2f} x "
        f"data.max_new_tokens; activations {a.act_bytes_per_token_step / 1e3:.0f} KB per token per TTT step "
        f"({a.act_bytes_per_token_step_checkpointed / 1e3:.1f} KB with checkpoint_layer; H100-measured)",
        f"  training {a.train_tok_s_h100[0][1] / 1e3:.1f}K tok/s at T=4K, {a.train_tok_s_h100[1][1] / 1e3:.1f}K at "
        f"32K per H100 (measured), scaled by bf16 FLOP/s for other GPUs; capture at {a.capture_mfu:.0%} MFU of the "
        f"target's active parameters per replica; regeneration per H100 replica {a.regen_tok_s_hf_h100:.0f} "
        f"generated tok/s with HF generate, {a.regen_tok_s_server_h100:,.0f} through a vLLM/SGLang server "
        f"(neither measured by eyas at this size)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from eyas.pipeline import recipe_and_run

    p = argparse.ArgumentParser(prog="eyas plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", help="recipe YAML or a shipped name (gpt-oss-120b, ...)")
    p.add_argument("--gpus", required=True, help="NxGPU: H100, H200, B200 or A100 (80GB), e.g. 8xH100")
    p.add_argument("--run", help="a finished run directory whose measured rates replace the throughput assumptions")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.max_length=32768")
    args = p.parse_intermixed_args(sys.argv[1:] if argv is None else argv)  # overrides before or after --gpus
    try:
        recipe, _ = recipe_and_run(args.recipe, None, args.overrides)
        print(render(recipe, plan(recipe, args.gpus, args.run)))
    except (ValueError, OSError) as e:
        raise as_input(e) from e
    return 0
