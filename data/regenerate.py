"""The `regen` stage: the target answers every training prompt itself.

The draft must learn the target's own distribution, so the answers in the data set are
replaced by the target's generations. Each prompt is rendered with the target's chat template
(`add_generation_prompt=True`), the target generates (greedy when `data.temperature == 0`),
and the generated TOKEN IDS are kept as they are (never decoded and re-tokenized), cut at
and including the first end-of-sequence token.

    RUN/regenerate/part-00000.jsonl   {"id", "input_ids": prompt + generated, "prompt_len", "finished"}

The loss mask of a sequence is 1 exactly on positions >= prompt_len (the generated tokens).
Parts are written atomically, one per `part_batches` batches; a re-run keeps the complete
parts and continues with the next one.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eyas.data.prompts import read_prompts
from eyas.data.target import input_device, load_recipe_target, resolve_path
from eyas.io import is_done, mark_done, read_done, read_jsonl, require_done, stage_dir, write_jsonl
from eyas.recipes.schema import Recipe

STAGE = "regenerate"
PART_BATCHES = 8  # batches per part file: what a crash can cost at most


def render_prompt(tokenizer, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> list[int]:
    """The chat-template token ids of `messages`, by default followed by the assistant
    generation prompt (whatever container this transformers version returns). `template_kwargs`
    reach the template (gpt-oss: reasoning_effort)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        **template_kwargs)
    ids = out["input_ids"] if isinstance(out, Mapping) else out
    return [int(t) for t in ids]


def eos_token_ids(model, tokenizer) -> list[int]:
    """End-of-sequence ids: the target's generation config (gpt-oss: <|return|>, <|call|>, …),
    else the tokenizer's eos token."""
    return _eos_ids(model.generation_config, tokenizer, model.name_or_path)


def _eos_ids(generation_config, tokenizer, name: str) -> list[int]:
    eos = generation_config.eos_token_id if generation_config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"{name}: neither the generation config nor the tokenizer names an "
                         "eos token, so generations could never finish")
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def target_tokenizer_and_eos(t) -> tuple:
    """The tokenizer and eos ids of the recipe's target without loading its weights (server backend)."""
    from transformers import AutoTokenizer, GenerationConfig

    path = resolve_path(t.model)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=t.trust_remote_code)
    try:
        gen = GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json
        gen = None
    return tok, _eos_ids(gen, tok, t.model)


def pad_token_id(model, tokenizer, eos_ids: list[int]) -> int:
    """The generation config's pad id, else the tokenizer's, else the first eos id."""
    for pad in (model.generation_config.pad_token_id, tokenizer.pad_token_id):
        if pad is not None:
            return int(pad)
    return eos_ids[0]


def reasoning_effort(weights: dict[str, float] | None, seed: int, prompt_id: str) -> str | None:
    """The effort of one prompt, drawn from `weights` with a generator seeded by (seed, prompt id): the
    same on every re-run and independent of the prompts' order. None without weights."""
    if not weights:
        return None
    levels = sorted(weights)
    return random.Random(f"{seed}:{prompt_id}").choices(levels, [weights[x] for x in levels])[0]


def effort_kwargs(effort: str | None) -> dict:
    """The chat-template keyword and the stored row field for one prompt's effort (none without one)."""
    return {} if effort is None else {"reasoning_effort": effort}


def effort_mix(seqs: list[dict]) -> dict[str, int] | None:
    """How many stored sequences had each reasoning effort (None when none was set)."""
    counts = Counter(s["reasoning_effort"] for s in seqs if "reasoning_effort" in s)
    return dict(sorted(counts.items())) or None


def cut_at_eos(tokens: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    """-> (tokens up to and including the first eos, whether an eos was found)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i + 1], True
    return tokens, False


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> input_ids, attention_mask (B, L), left padded to the longest prompt (for `generate`)."""
    B, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p)
        mask[b, L - len(p):] = 1
    return ids, mask


def generate_batch(model, prompts: list[list[int]], *, eos_ids: list[int], pad_id: int, max_new_tokens: int,
                   temperature: float, top_p: float) -> list[tuple[list[int], bool]]:
    """Left-padded batched generation. -> per prompt (generated ids cut at eos, finished)."""
    ids, mask = left_pad(prompts, pad_id)
    L = ids.shape[1]
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 \
        else {"do_sample": False}
    with torch.no_grad():
        dev = input_device(model)
        out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                             max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id,
                             **sampling)  # (B, L + n_new)
    eos = set(eos_ids)
    return [cut_at_eos(row, eos) for row in out[:, L:].tolist()]


def loss_mask(seq: dict) -> list[int]:
    """1 on the generated tokens (positions >= prompt_len), 0 on the prompt."""
    n, p = len(seq["input_ids"]), seq["prompt_len"]
    return [0] * p + [1] * (n - p)


def part_path(run_dir: str | Path, index: int) -> Path:
    return Path(run_dir) / STAGE / f"part-{index:05d}.jsonl"


def read_sequences(run_dir: str | Path) -> list[dict]:
    """Every stored sequence, in part order. -> [{"id", "input_ids", "prompt_len", "finished"}]."""
    parts = sorted((Path(run_dir) / STAGE).glob("part-*.jsonl"))
    return [row for p in parts for row in read_jsonl(p)]


def run_regenerate(recipe: Recipe, run_dir: str | Path, progress: bool = True,
                   part_batches: int = PART_BATCHES) -> dict:
    """The `regenerate` stage. Prompts longer than `data.max_prompt_tokens` are skipped (cutting a
    rendered chat prompt would cut off its generation prompt) and counted."""
    if is_done(run_dir, STAGE):
        return read_done(run_dir, STAGE)
    require_done(run_dir, "prompts", STAGE)
    t0 = time.time()
    d, t = recipe.data, recipe.target
    out_dir = stage_dir(run_dir, STAGE)
    for stray in out_dir.glob(".*.tmp"):  # left by a killed process
        stray.unlink()
    if d.backend == "server":
        model, (tok, eos_ids) = None, target_tokenizer_and_eos(t)
    else:
        model, tok = load_recipe_target(t)
        eos_ids = eos_token_ids(model, tok)
        pad_id = pad_token_id(model, tok, eos_ids)

    prompts = read_prompts(run_dir, "train")
    efforts = {p["id"]: reasoning_effort(d.reasoning_effort, d.seed, p["id"]) for p in prompts}
    if d.reasoning_effort and "reasoning_effort" not in (tok.chat_template or ""):
        raise ValueError(f"data.reasoning_effort: the chat template of {t.model} does not use reasoning_effort, "
                         "so the effort would not reach the target; leave data.reasoning_effort unset")
    rendered = [(p["id"], render_prompt(tok, p["messages"], **effort_kwargs(efforts[p["id"]])))
                for p in prompts]
    kept = [(pid, ids) for pid, ids in rendered if len(ids) <= d.max_prompt_tokens]
    if not kept:
        raise RuntimeError(f"data.max_prompt_tokens={d.max_prompt_tokens}: every one of the {len(rendered)} "
                           "training prompts is longer once rendered with the chat template")
    kept.sort(key=lambda x: len(x[1]))  # stable: similar lengths share a batch, less padding
    batches = [kept[i:i + d.batch_size] for i in range(0, len(kept), d.batch_size)]
    parts = [batches[i:i + part_batches] for i in range(0, len(batches), part_batches)]

    extra = sorted(q for q in out_dir.glob("part-*.jsonl") if int(q.stem.split("-")[1]) >= len(parts))
    if extra:
        raise RuntimeError(f"{extra[0]}: this run makes only {len(parts)} parts (the prompts or data settings "
                           f"changed since it was written); delete {out_dir} to regenerate from scratch")
    new_tokens, gen_s = 0, 0.0
    bar = tqdm(total=len(batches), desc="regenerate", unit="batch", disable=not progress)
    todo = []
    for p, part in enumerate(parts):
        path = part_path(run_dir, p)
        expected = [pid for batch in part for pid, _ in batch]
        if path.is_file():
            stored = [row["id"] for row in read_jsonl(path)]
            if stored != expected:
                raise RuntimeError(f"{path}: holds other prompts than this run would put there (the prompts, "
                                   "data.batch_size or data.max_prompt_tokens changed since it was written); "
                                   f"delete {out_dir} to regenerate from scratch")
            bar.update(len(part))
        else:
            todo.append(p)
    if d.backend == "server":
        bar.close()
        new_tokens, gen_s = _through_servers(d, run_dir, parts, todo, eos_ids, efforts, progress)
        todo = []
    for p in todo:
        part, path = parts[p], part_path(run_dir, p)
        rows = []
        for j, batch in enumerate(part):
            torch.manual_seed(d.seed * 1_000_003 + p * part_batches + j)  # resume-stable sampling
            tb = time.time()
            gens = generate_batch(model, [ids for _, ids in batch], eos_ids=eos_ids, pad_id=pad_id,
                                  max_new_tokens=d.max_new_tokens, temperature=d.temperature, top_p=d.top_p)
            gen_s += time.time() - tb
            for (pid, ids), (gen, finished) in zip(batch, gens):
                rows.append({"id": pid, "input_ids": ids + gen, "prompt_len": len(ids), "finished": finished,
                             **effort_kwargs(efforts[pid])})
                new_tokens += len(gen)
            bar.update(1)
            bar.set_postfix(tok_s=f"{new_tokens / max(gen_s, 1e-9):.0f}")
        write_jsonl(path, rows)
    bar.close()

    seqs = read_sequences(run_dir)
    if len(seqs) != len(kept):
        raise RuntimeError(f"{out_dir}: {len(seqs)} sequences stored for {len(kept)} prompts")
    gen_lens = [len(s["input_ids"]) - s["prompt_len"] for s in seqs]
    stats = {
        "num_prompts": len(rendered),
        "num_skipped_long": len(rendered) - len(kept),
        "num_sequences": len(seqs),
        "num_parts": len(parts),
        "mean_generated_tokens": sum(gen_lens) / len(seqs),
        "fraction_finished": sum(s["finished"] for s in seqs) / len(seqs),
        "generated_tokens_this_run": new_tokens,
        "generation_tokens_per_s": new_tokens / gen_s if gen_s > 0 else None,
        "backend": d.backend,
        "temperature": d.temperature,
        "reasoning_effort_mix": effort_mix(seqs),
        "wall_s": round(time.time() - t0, 3),
    }
    mark_done(run_dir, STAGE, stats)
    return stats


def _through_servers(d, run_dir, parts: list, todo: list[int], eos_ids: list[int], efforts: dict, progress: bool
                     ) -> tuple[int, float]:
    """`data.backend: server`: every prompt of the parts in `todo` through the fleet at once; each part
    is written (atomically) as soon as its last prompt is back. -> (new tokens, wall seconds)."""
    from eyas.data.server import regenerate_through_servers

    params = {"max_tokens": d.max_new_tokens, "temperature": d.temperature, "top_p": d.top_p}
    jobs, waiting, rows = [], {}, {}
    for p in todo:
        flat = [item for batch in parts[p] for item in batch]
        waiting[p], rows[p] = len(flat), [None] * len(flat)
        for i, (pid, ids) in enumerate(flat):  # a seed per prompt: sampled data is the same on a re-run
            jobs.append(((p, i, pid), d.seed * 1_000_003 + p * 65_536 + i, ids))
    eos = set(eos_ids)
    bar = tqdm(total=len(jobs), desc="regenerate (server)", unit="prompt", disable=not progress)
    state = {"new": 0, "t0": time.time()}

    def done(key, ids, generated, finish_reason):
        p, i, pid = key
        gen, finished = cut_at_eos(generated, eos)
        rows[p][i] = {"id": pid, "input_ids": ids + gen, "prompt_len": len(ids),
                      "finished": finished or finish_reason == "stop", **effort_kwargs(efforts[pid])}
        state["new"] += len(gen)
        waiting[p] -= 1
        if waiting[p] == 0:
            write_jsonl(part_path(run_dir, p), rows.pop(p))
        bar.update(1)
        bar.set_postfix(tok_s=f"{state['new'] / max(time.time() - state['t0'], 1e-9):.0f}")

    regenerate_through_servers(d.server_urls, d.server_model, jobs, params, eos_ids, d.server_concurrency,
                               d.server_timeout_s, d.server_retries, done)
    bar.close()
    return state["new"], time.time() - state["t0"]
