"""The `regenerate` stage: the target answers every training conversation itself.

The draft must learn the target's own distribution, so the answers in the data set are
replaced by the target's generations. A conversation's user turns are answered in order: turn t's
prompt is the target's chat template over the system message, the earlier user turns each followed
by the target's OWN answer (as the template renders an earlier answer: gpt-oss's drops its analysis
channel and keeps the final one), and user turn t, with `add_generation_prompt=True`. The target
generates (greedy when `data.temperature == 0`; gpt-oss: analysis channel, then final), and the
generated TOKEN IDS are kept as they are (never decoded and re-tokenized), cut at and including the
first end-of-sequence token. Each turn is one training sequence:

    RUN/regenerate/part-00000.jsonl   {"id": "17" (turn 0) | "17/2", "conversation": "17", "turn": 2,
                                       "input_ids": prompt + generated, "prompt_len", "finished",
                                       "reasoning_effort"?}

The loss mask of a sequence is 1 exactly on positions >= prompt_len (every token the target
generated in that turn). A conversation ends early at an answer that did not finish or a prompt
longer than `data.max_prompt_tokens`. Parts (conversations, `part_batches` batches each) are written
atomically; a re-run keeps the complete parts and continues with the next one. Parts are shared out
round robin between shards (data/sharding.py) and keep their global names, so the joined stage is the
single-process one.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eyas.data.chat import (
    answer_message,
    cut_at_eos,
    effort_kwargs,
    eos_token_ids,
    generation_eos_ids,
    is_harmony,
    left_pad,
    pad_token_id,
    reasoning_effort,
    render_prompt,
    split_turns,
)
from eyas.data.prompts import read_prompts
from eyas.data.sharding import Shard, Slices, current_shard, target_for_rank
from eyas.data.target import (
    context_length,
    input_device,
    load_recipe_target,
    refuse_vllm_mxfp4,
    resolve_path,
    server_dtype,
)
from eyas.infra.io import read_jsonl, write_json, write_jsonl
from eyas.infra.layout import is_done, mark_done, read_done, require_done, stage_dir
from eyas.recipes.schema import DataSection, Recipe

STAGE = "regenerate"
HF_FIX = (
    "set data.backend: vllm (vLLM's replicas, the vllm section; it runs MXFP4 weights as they are stored)"
)
PART_BATCHES = 8  # batches per part file: what a crash can cost at most


def target_tokenizer_and_eos(t) -> tuple:
    """The tokenizer and eos ids of the recipe's target without loading its weights (server backend)."""
    from transformers import AutoTokenizer, GenerationConfig

    path = resolve_path(t.model)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=t.trust_remote_code)
    try:
        gen = GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json
        gen = None
    return tok, generation_eos_ids(gen, tok, t.model)


def effort_mix(seqs: list[dict]) -> dict[str, int] | None:
    """How many stored sequences had each reasoning effort (None when none was set)."""
    counts = Counter(s["reasoning_effort"] for s in seqs if "reasoning_effort" in s)
    return dict(sorted(counts.items())) or None


def generate_batch(
    model,
    prompts: list[list[int]],
    *,
    eos_ids: list[int],
    pad_id: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
) -> list[tuple[list[int], bool]]:
    """Left-padded batched generation. -> per prompt (generated ids cut at eos, finished)."""
    ids, mask = left_pad(prompts, pad_id)
    L = ids.shape[1]
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
        if temperature > 0
        else {"do_sample": False}
    )
    with torch.no_grad():
        dev = input_device(model)
        out = model.generate(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_ids,
            pad_token_id=pad_id,
            **sampling,
        )  # (B, L + n_new)
    eos = set(eos_ids)
    return [cut_at_eos(row, eos) for row in out[:, L:].tolist()]


def loss_mask(seq: dict) -> list[int]:
    """1 on the generated tokens (positions >= prompt_len), 0 on the prompt."""
    n, p = len(seq["input_ids"]), seq["prompt_len"]
    return [0] * p + [1] * (n - p)


def part_path(run_dir: str | Path, index: int) -> Path:
    return Path(run_dir) / STAGE / f"part-{index:05d}.jsonl"


def read_sequences(run_dir: str | Path) -> list[dict]:
    """Every stored sequence, in part order. -> [{"id", "input_ids", "prompt_len", "finished", ...}]."""
    parts = sorted((Path(run_dir) / STAGE).glob("part-*.jsonl"))
    return [row for p in parts for row in read_jsonl(p)]


def conversation_of(seq: dict) -> str:
    """What a stored sequence is held out with (data/splits.py): its prompt's group where it has one (the
    document a built-in long prompt quotes: data/prompts.py), else the conversation it is a turn of (runs
    written before turns were recorded: its id)."""
    return seq.get("group") or seq.get("conversation", seq["id"])


def prompt_of(seq: dict) -> str:
    """The prompt (conversation) a stored sequence answers a turn of, whatever its group: what a part
    holds and a turn is counted by (conversation_of is what it is held out with)."""
    return seq.get("conversation", seq["id"])


def capture_order(seqs: list[dict]) -> list[int]:
    """The order training reads the sequences in, an offline capture's: shortest first, stable (the same
    on every run), so capture's sequence i is seqs[capture_order(seqs)[i]]."""
    return sorted(range(len(seqs)), key=lambda i: len(seqs[i]["input_ids"]))


def conversations_in_capture_order(run_dir: str | Path) -> list[str]:
    """The conversation of each of the run's sequences, in capture order: what the validation split
    (train/validation.py) holds out whole, as a later turn's prompt carries the earlier turns."""
    seqs = read_sequences(run_dir)
    return [conversation_of(seqs[i]) for i in capture_order(seqs)]


class Conversations:
    """The conversations of the run and how each goes on: turn t's prompt is the template's rendering of
    the earlier turns, each user turn followed by the target's own answer to it, then user turn t.

    A conversation ends early when an answer did not finish (max_new_tokens) or the next prompt is
    longer than `data.max_prompt_tokens`; its later turns are not asked (counted in the stage record)."""

    def __init__(
        self, tokenizer, prompts: list[dict], efforts: dict, eos_ids: list[int], max_prompt_tokens: int
    ):
        self.tok, self.efforts, self.eos_ids = tokenizer, efforts, eos_ids
        self.max_prompt_tokens = max_prompt_tokens
        self.harmony = is_harmony(tokenizer)  # once: the vocabulary is 201K entries on gpt-oss
        self.turns = {p["id"]: split_turns(p["messages"]) for p in prompts}  # id -> (system, users)
        self.groups = {p["id"]: p["group"] for p in prompts if "group" in p}  # data/prompts.py
        self.history: dict[str, list[dict]] = {}  # id -> the messages of the last prompt rendered

    def render(self, pid: str, messages: list[dict]) -> list[int]:
        self.history[pid] = messages
        return render_prompt(self.tok, messages, **effort_kwargs(self.efforts[pid]))

    def first(self, pid: str) -> list[int]:
        system, users = self.turns[pid]
        return self.render(pid, system + users[:1])

    def row(self, pid: str, turn: int, ids: list[int], gen: list[int], finished: bool) -> dict:
        return {
            "id": pid if turn == 0 else f"{pid}/{turn}",
            "conversation": pid,
            **({"group": self.groups[pid]} if pid in self.groups else {}),
            "turn": turn,
            "input_ids": ids + gen,
            "prompt_len": len(ids),
            "finished": finished,
            **effort_kwargs(self.efforts[pid]),
        }

    def next(self, pid: str, turn: int, gen: list[int], finished: bool) -> list[int] | None:
        """The prompt ids of turn `turn + 1` after answer `gen` to turn `turn`; None when the conversation
        ends."""
        users = self.turns[pid][1]
        if turn + 1 >= len(users) or not finished:
            return None
        answer = answer_message(self.tok, gen, self.eos_ids, self.harmony)
        ids = self.render(pid, self.history[pid] + [answer, users[turn + 1]])
        return ids if len(ids) <= self.max_prompt_tokens else None

    def num_user_turns(self, pid: str) -> int:
        return len(self.turns[pid][1])


def turn_seed(*keys) -> int:
    """A sampling seed from (data.seed, where the turn is): the same on every re-run and in any shard."""
    return random.Random(":".join(map(str, keys))).getrandbits(31)


def run_regenerate(
    recipe: Recipe,
    run_dir: str | Path,
    progress: bool = True,
    part_batches: int = PART_BATCHES,
    shard: str | Shard | None = None,
) -> dict:
    """The `regenerate` stage (this process's `shard` of it: data/sharding.py). A conversation whose first
    prompt is longer than `data.max_prompt_tokens` is skipped (cutting a rendered chat prompt would cut
    off its generation prompt) and counted."""
    if is_done(run_dir, STAGE):
        return read_done(run_dir, STAGE)
    require_done(run_dir, "prompts", STAGE)
    t0 = time.time()
    shard = current_shard(shard)
    d, t = recipe.data, target_for_rank(recipe.target, shard)
    if d.backend != "hf":
        model, (tok, eos_ids) = None, target_tokenizer_and_eos(t)
    else:
        model, tok = load_recipe_target(t, fix=HF_FIX)
        eos_ids = eos_token_ids(model, tok)
    convs, kept, num_prompts = _first_prompts(d, t.model, tok, eos_ids, read_prompts(run_dir, "train"))
    batches = [kept[i : i + d.batch_size] for i in range(0, len(kept), d.batch_size)]
    parts = [batches[i : i + part_batches] for i in range(0, len(batches), part_batches)]
    slices = Slices(
        Path(run_dir),
        STAGE,
        shard,
        "shard",  # a slice's record is written after its parts
        complete=lambda x: all(part_path(run_dir, p).is_file() for p in x["parts"]),
    )
    mine = shard.round_robin(len(parts))  # parts are alike
    todo = _todo(slices, parts, mine)
    desc = "regenerate" + (f" {shard}" if shard.count > 1 else "")
    if d.backend == "server":
        new_tokens, gen_s = _through_servers(
            d, d.server_urls, run_dir, parts, todo, convs, eos_ids, progress, desc
        )
    elif d.backend == "vllm":
        new_tokens, gen_s = _through_vllm(
            d, t, run_dir, parts, todo, convs, eos_ids, progress, desc, v=recipe.vllm
        )
    else:
        new_tokens, gen_s = _through_hf(
            d, run_dir, parts, mine, todo, model, tok, convs, eos_ids, progress, desc
        )
    rate = new_tokens / gen_s if gen_s > 0 else None
    if shard.count > 1:
        write_json(
            slices.record(),
            {
                "shard": str(shard),
                "parts": mine,
                "generated_tokens": new_tokens,
                "generation_tokens_per_s": rate,
            },
        )
    counts = {
        "num_servers": _num_servers(recipe),
        "num_prompts": num_prompts,
        "num_skipped_long": num_prompts - len(kept),
        "num_parts": len(parts),
    }
    return slices.finish(
        lambda: _stage_record(d, slices, convs, counts, new_tokens, rate, t0),
        {"generated_tokens_this_run": new_tokens, "generation_tokens_per_s": rate},
    )


def _num_servers(recipe: Recipe) -> int | None:
    """The servers regeneration asked (per shard): the URLs, or vLLM's replicas; None for the HF backend."""
    d = recipe.data
    if d.backend == "vllm":
        from eyas.infra.vllm.vllm_fleet import replicas  # lazy: httpx

        return len(replicas(recipe.vllm))
    return len(d.server_urls) if d.backend == "server" else None


def _first_prompts(d: DataSection, target: str, tok, eos_ids: list[int], prompts: list[dict]) -> tuple:
    """The conversations of the run and the first prompt of each that fits `data.max_prompt_tokens`.

    -> (Conversations, [(id, first prompt ids)] shortest first, number of prompts)."""
    efforts = {p["id"]: reasoning_effort(d.reasoning_effort, d.seed, p["id"]) for p in prompts}
    if d.reasoning_effort and "reasoning_effort" not in (tok.chat_template or ""):
        raise ValueError(
            f"data.reasoning_effort: the chat template of {target} does not use "
            "reasoning_effort, so the effort would not reach the target; leave "
            "data.reasoning_effort unset"
        )
    convs = Conversations(tok, prompts, efforts, eos_ids, d.max_prompt_tokens)
    rendered = [(p["id"], convs.first(p["id"])) for p in prompts]
    kept = [(pid, ids) for pid, ids in rendered if len(ids) <= d.max_prompt_tokens]
    if not kept:
        raise RuntimeError(
            f"data.max_prompt_tokens={d.max_prompt_tokens}: every one of the {len(rendered)} "
            "training prompts is longer once rendered with the chat template"
        )
    kept.sort(key=lambda x: len(x[1]))  # stable: similar lengths share a batch, less padding
    return convs, kept, len(rendered)


def _todo(slices: Slices, parts: list, mine: list[int]) -> list[int]:
    """This shard's parts that are not written yet. A written part is kept if it holds the conversations this
    run puts there; a killed process's temporaries are deleted (only this shard's: others may be writing)."""
    run_dir, out_dir = slices.run_dir, stage_dir(slices.run_dir, STAGE)
    extra = sorted(q for q in out_dir.glob("part-*.jsonl") if int(q.stem.split("-")[1]) >= len(parts))
    if extra:
        raise RuntimeError(
            f"{extra[0]}: this run makes only {len(parts)} parts (the prompts or data "
            f"settings changed since it was written); delete {out_dir} to regenerate from "
            "scratch"
        )
    slices.remove_strays([f".{part_path(run_dir, p).name}.*.tmp" for p in mine])
    todo = []
    for p in mine:
        path = part_path(run_dir, p)
        if not path.is_file():
            todo.append(p)
            continue
        stored = [prompt_of(row) for row in read_jsonl(path) if row.get("turn", 0) == 0]
        if stored != [pid for batch in parts[p] for pid, _ in batch]:
            raise RuntimeError(
                f"{path}: holds other prompts than this run would put there (the prompts, "
                "data.batch_size or data.max_prompt_tokens changed since it was written); "
                f"delete {out_dir} to regenerate from scratch"
            )
    return todo


def _stage_record(
    d: DataSection,
    slices: Slices,
    convs: Conversations,
    counts: dict,
    new_tokens: int,
    rate: float | None,
    t0: float,
) -> dict:
    """The joined stage's record (every part written): what was asked, answered and generated, this run's
    speed (each slice's), and DONE. `counts`: num_prompts, num_skipped_long, num_parts."""
    seqs = read_sequences(slices.run_dir)
    firsts = [s for s in seqs if s.get("turn", 0) == 0]
    kept = counts["num_prompts"] - counts["num_skipped_long"]
    if len(firsts) != kept:
        raise RuntimeError(f"{slices.out_dir}: {len(firsts)} conversations stored for {kept} prompts")
    answered = Counter(prompt_of(s) for s in seqs)
    gen_lens = [len(s["input_ids"]) - s["prompt_len"] for s in seqs]
    shard = slices.shard
    shards = slices.records() if shard.count > 1 else []
    stats = {
        "num_prompts": counts["num_prompts"],
        "num_skipped_long": counts["num_skipped_long"],
        "num_sequences": len(seqs),
        "num_conversations": len(firsts),
        "num_turns_not_answered": sum(convs.num_user_turns(pid) - n for pid, n in answered.items()),
        "num_parts": counts["num_parts"],
        "mean_generated_tokens": sum(gen_lens) / len(seqs),
        "fraction_finished": sum(s["finished"] for s in seqs) / len(seqs),
        "generated_tokens_this_run": new_tokens
        + sum(s["generated_tokens"] for s in shards if s["shard"] != str(shard)),
        "generation_tokens_per_s": sum(s["generation_tokens_per_s"] or 0 for s in shards) or rate,
        "backend": d.backend,
        "num_servers": counts["num_servers"],
        "temperature": d.temperature,
        "reasoning_effort_mix": effort_mix(firsts),
        "wall_s": round(time.time() - t0, 3),
    }
    if shards:
        stats["shards"] = shards
    mark_done(slices.run_dir, STAGE, stats)
    return stats


def _through_hf(
    d,
    run_dir,
    parts: list,
    mine: list[int],
    todo: list[int],
    model,
    tok,
    convs: Conversations,
    eos_ids: list[int],
    progress: bool,
    desc: str,
) -> tuple[int, float]:
    """`data.backend: hf`: the parts in `todo`, batch by batch; a batch's conversations go on turn by turn
    together. -> (new tokens, generation seconds)."""
    pad_id = pad_token_id(model, tok, eos_ids)
    new_tokens, gen_s = 0, 0.0
    bar = tqdm(
        total=sum(len(parts[p]) for p in mine),
        initial=sum(len(parts[p]) for p in mine if p not in todo),
        desc=desc,
        unit="batch",
        disable=not progress,
    )
    for p in todo:
        rows = []
        for j, batch in enumerate(parts[p]):
            answers: dict[str, list[dict]] = {pid: [] for pid, _ in batch}
            active, turn = list(batch), 0
            while active:
                torch.manual_seed(turn_seed(d.seed, p, j, turn))  # resume- and shard-stable sampling
                tb = time.time()
                gens = generate_batch(
                    model,
                    [ids for _, ids in active],
                    eos_ids=eos_ids,
                    pad_id=pad_id,
                    max_new_tokens=d.max_new_tokens,
                    temperature=d.temperature,
                    top_p=d.top_p,
                )
                gen_s += time.time() - tb
                following = []
                for (pid, ids), (gen, finished) in zip(active, gens):
                    answers[pid].append(convs.row(pid, turn, ids, gen, finished))
                    new_tokens += len(gen)
                    nxt = convs.next(pid, turn, gen, finished)
                    if nxt is not None:
                        following.append((pid, nxt))
                active, turn = following, turn + 1
            rows += [row for pid, _ in batch for row in answers[pid]]
            bar.update(1)
            bar.set_postfix(tok_s=f"{new_tokens / max(gen_s, 1e-9):.0f}")
        write_jsonl(part_path(run_dir, p), rows)
    bar.close()
    return new_tokens, gen_s


def _through_vllm(d, t, run_dir, parts: list, todo: list[int], *rest, v) -> tuple[int, float]:
    """`data.backend: vllm`: a vLLM server per replica of the recipe's `vllm` section (eyas/infra/vllm/
    vllm_fleet.py: 127.0.0.1, the target's dtype, checked while they serve, stopped when done), the prompts
    spread over them by the server path. Nothing to do: no server started."""
    if not todo:
        return 0, 0.0
    from eyas.infra.vllm.vllm_fleet import VllmFleet, engine_args, replicas  # lazy: httpx

    refuse_vllm_mxfp4(t, "data.backend")
    where = replicas(v)
    need = min(d.max_prompt_tokens + d.max_new_tokens, context_length(t))
    args = engine_args(v, where[0].kind, need)
    log_dir = Path(run_dir) / STAGE
    with VllmFleet(resolve_path(t.model), where, args, server_dtype(t.dtype), log_dir) as fleet:
        return _through_servers(d, fleet.urls, run_dir, parts, todo, *rest, health=fleet.check)


def _through_servers(
    d,
    urls: list[str],
    run_dir,
    parts: list,
    todo: list[int],
    convs: Conversations,
    eos_ids: list[int],
    progress: bool,
    desc: str,
    health=None,
) -> tuple[int, float]:
    """`data.backend: server`: every conversation of the parts in `todo` through the fleet at once, each
    turn sent when the answer before it is back; a part is written (atomically) as soon as its last
    conversation ends. -> (new tokens, wall seconds)."""
    from eyas.data.server import regenerate_through_servers  # lazy: httpx

    params = {"max_tokens": d.max_new_tokens, "temperature": d.temperature, "top_p": d.top_p}
    jobs, waiting, rows = [], {}, {}
    for p in todo:
        flat = [item for batch in parts[p] for item in batch]
        waiting[p], rows[p] = len(flat), [[] for _ in flat]
        for i, (pid, ids) in enumerate(flat):  # a seed per turn: sampled data is the same on a re-run
            jobs.append(((p, i, pid, 0), turn_seed(d.seed, pid, 0), ids))
    eos = set(eos_ids)
    bar = tqdm(total=len(jobs), desc=f"{desc} (server)", unit="conversation", disable=not progress)
    state = {"new": 0, "t0": time.time()}

    def done(key, ids, generated, finish_reason):
        p, i, pid, turn = key
        gen, finished = cut_at_eos(generated, eos)
        finished = finished or finish_reason == "stop"
        rows[p][i].append(convs.row(pid, turn, ids, gen, finished))
        state["new"] += len(gen)
        bar.set_postfix(tok_s=f"{state['new'] / max(time.time() - state['t0'], 1e-9):.0f}")
        nxt = convs.next(pid, turn, gen, finished)
        if nxt is not None:
            return (p, i, pid, turn + 1), turn_seed(d.seed, pid, turn + 1), nxt
        waiting[p] -= 1
        if waiting[p] == 0:
            write_jsonl(part_path(run_dir, p), [row for conv in rows.pop(p) for row in conv])
        bar.update(1)
        return None

    if jobs:
        regenerate_through_servers(
            urls,
            d.server_model,
            jobs,
            params,
            eos_ids,
            d.server_concurrency,
            d.server_timeout_s,
            d.server_retries,
            done,
            health,
            d.server_stall_s,
        )
    bar.close()
    return state["new"], time.time() - state["t0"]
