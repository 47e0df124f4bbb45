"""The turns of a run's prompts stage for `eyas plan --run`: the target's tokenizer (a local copy or the
hub cache first, then the hub), each turn's prompt length as regeneration renders it with the chat
template, and the answered turns and mean prompt of the run's conversations."""

from __future__ import annotations

import contextlib
import io
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from eyas.infra.errors import EyasError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from eyas.recipes.schema import Recipe

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
SAMPLED_CONVERSATIONS = 2000  # conversations of the prompts stage rendered to measure prompt lengths
# records of a hub dataset a plan keeps, about twice as many read over the network (the shuffle's buffer):
# LongAlign-10k's run 8K-64K tokens; the mean of 200 lengths spread evenly over that range has a standard
# error of 3%, if the first records of the dataset's files are typical of it (they are what is streamed)
HUB_SAMPLED = 200
TEMPLATE_TOKENS = 8  # a chat template's tokens around one message, without a tokenizer to render it


@dataclass
class TurnCount:
    """What a prompts stage says of the data: its answered turns and their mean prompt length."""

    turns_per_conversation: float  # answered turns (training sequences) per conversation
    mean_prompt: float  # tokens, over the answered turns
    rendered: int  # conversations rendered with the chat template (0: no tokenizer, lengths assumed)
    conversations: int  # training conversations in the prompts stage
    user_turns: int  # counted in all of them (at most data.max_turns each)
    kept_answer_tokens: float  # of each earlier answer, in a later turn's prompt
    no_tokenizer: str  # why the prompts were not rendered, how to get a tokenizer that can; "" if they were
    origin: str = "--run's prompts stage"  # or "a sample of each source, mixed by weight" (source_samples)
    unread: str = ""  # sources a plan could not read (no network, a package missing), priced as assumed
    prompt_lengths: list[float] = field(default_factory=list)  # tokens, each answered turn of the sample


def plan_tokenizer(recipe: Recipe) -> tuple[PreTrainedTokenizerBase | None, str]:
    """The target's tokenizer for rendering prompts (a few MB): from a local copy or the hub cache first,
    then the hub. -> (tokenizer, "") or (None, why it cannot be used and how to get one that can)."""
    from transformers import AutoTokenizer

    from eyas.data.target import resolve_path  # lazy: torch

    name = resolve_path(recipe.target.model)
    errors = []
    for local in (True, False):
        try:
            tok = AutoTokenizer.from_pretrained(
                name, trust_remote_code=recipe.target.trust_remote_code, local_files_only=local
            )
        except (OSError, ValueError) as e:
            errors.append(str(e).splitlines()[0] if str(e) else type(e).__name__)
            continue
        if tok.chat_template:
            return tok, ""
        errors.append("it has no chat template")
        break
    fix = (
        "put the model's tokenizer files (tokenizer.json, tokenizer_config.json, its chat template) "
        f"in {name}"
        if Path(name).is_dir()
        else f"fetch only its tokenizer files where there is network: `hf download {recipe.target.model} "
        f"{' '.join(TOKENIZER_FILES)}`"
    )
    return None, (
        f"the tokenizer of {recipe.target.model} could not be used ({errors[-1]}); to render the "
        f"prompts, {fix}"
    )


def turn_prompt_lengths(
    tok: PreTrainedTokenizerBase,
    system: list[dict],
    users: list[dict],
    kept: list[float],
    limit: int,
    **template_kwargs,
) -> list[float]:
    """The prompt length of each turn of one conversation as regeneration renders it, before any answer
    exists: the chat template around the conversation so far with every earlier answer empty, plus
    `kept[i]` tokens for earlier answer i (the part of it the template keeps). Stops before the first
    turn longer than `limit` (data.max_prompt_tokens), which regeneration does not ask."""
    from eyas.data.chat import render_prompt  # lazy: torch

    lengths, context = [], list(system)
    for t, user in enumerate(users):
        context = context + [user]
        n = len(render_prompt(tok, context, **template_kwargs)) + sum(kept[:t])
        if n > limit:
            break
        lengths.append(n)
        context = context + [{"role": "assistant", "content": ""}]
    return lengths


def estimated_prompt_lengths(
    system: list[dict], users: list[dict], kept: float, limit: int, chars_per_token: float
) -> list[float]:
    """turn_prompt_lengths without a tokenizer: each turn's messages so far at `chars_per_token`, plus
    TEMPLATE_TOKENS a message for the chat template, plus the earlier answers' kept part; stops before the
    first turn longer than `limit`."""
    lengths, chars = [], sum(len(m["content"]) for m in system)
    for t, user in enumerate(users):
        chars += len(user["content"])
        n = chars / chars_per_token + TEMPLATE_TOKENS * (len(system) + 2 * t + 1) + t * kept
        if n > limit:
            break
        lengths.append(n)
    return lengths


@dataclass
class SourceSample:
    """One source of data.prompts as a plan sees it before any run."""

    label: str  # data.prompts[k]'s source
    weight: float  # its share of data.num_prompts (data.prompts[k].weight)
    rows: list[dict] | None  # a seeded sample of its conversations as the prompts stage reduces them
    why: str = ""  # why rows is None: not read (a hub dataset out of reach, a package not installed)
    streamed: int = 0  # records streamed from the hub (a hub dataset's sample), else 0


def source_samples(recipe: Recipe) -> list[SourceSample]:
    """Before any run: up to SAMPLED_CONVERSATIONS of each source's conversations (seeded), reduced to the
    user turns the prompts stage keeps (data/prompts.py); each source is priced apart and weighed by its
    weight (combined), so a source smaller than its share counts in full. A hub dataset is streamed, only
    HUB_SAMPLED of its records (data/prompts.py hub_sample); one that cannot be read (no network, a set
    whose package is missing): rows None, and why."""
    from eyas.data.prompts import (  # lazy: torch
        hub_sample,
        is_hub_dataset,
        load_conversations,
        prompt_sources,
        user_turns,
    )
    from eyas.data.target import resolve_path  # lazy: torch

    d = recipe.data
    out = []
    for k, src in enumerate(prompt_sources(d)):
        path = resolve_path(src.source)
        key = "data.prompts" if isinstance(d.prompts, str) else f"data.prompts[{k}].source"
        hub = is_hub_dataset(path)
        try:
            if hub:
                print(f"eyas plan: streaming {HUB_SAMPLED} records of {src.source}", file=sys.stderr)
                convs = hub_sample(src.source, src.hub_config, src.split, HUB_SAMPLED, d.seed, key)
            else:
                with contextlib.redirect_stdout(io.StringIO()):  # a set's notes (a cut file): the stage's
                    convs = load_conversations(path, src.split, src.hub_config, key)
        except EyasError as e:  # no network, a package not installed, no such file: priced as assumed
            out.append(SourceSample(src.source, src.weight, None, str(e)))
            continue
        except Exception as e:  # noqa: BLE001  a plan prices what it can: `datasets`' other failures to stream
            # a hub source (a split or config it lacks, an HTTP error) are priced as assumed and named too
            if not hub:
                raise
            first = str(e).splitlines()[0] if str(e) else ""
            out.append(SourceSample(src.source, src.weight, None, f"{type(e).__name__}: {first}"))
            continue
        picked = random.Random(d.seed).sample(range(len(convs)), min(len(convs), SAMPLED_CONVERSATIONS))
        turns = [user_turns(convs[i], d.system_prompt, d.max_turns) for i in picked]
        rows = [{"id": f"{k}:{i}", "messages": m} for i, m in zip(picked, turns)]
        why = "" if rows else "no conversations"
        out.append(SourceSample(src.source, src.weight, rows, why, len(convs) if hub else 0))
    return out


def combined(parts: list[tuple[float, TurnCount | None]], assumed_prompt: float) -> tuple[float, float]:
    """Sources priced apart -> (answered turns per conversation, mean prompt per answered turn) of their
    mix: each source's turns weighed by its weight, each prompt by its source's turns (a sequence is a turn);
    a source not read (None) at one turn of `assumed_prompt`."""
    total = sum(w for w, _ in parts)
    turns = [
        (w / total, t.turns_per_conversation if t else 1.0, t.mean_prompt if t else assumed_prompt)
        for w, t in parts
    ]
    per_conversation = sum(w * n for w, n, _ in turns)
    return per_conversation, sum(w * n * m for w, n, m in turns) / per_conversation


def spread(sample, n: int, mean: float) -> np.ndarray:
    """`n` sequence lengths distributed as `sample`, scaled to `mean`: the lengths a run of n sequences will
    have, from a smaller run's or a source sample's. Its quantiles at n evenly spaced points, interpolated
    between the sample's sorted lengths at their midpoint ranks (Hazen's; the sample's mean, least and
    greatest kept: the plain interpolation between ends would cut the long tail that attention and padding
    cost most in)."""
    if n < 1 or not len(sample):
        return np.zeros(0)
    q = np.quantile(np.asarray(sample, dtype=np.float64), (np.arange(n) + 0.5) / n, method="hazen")
    return q * (mean / q.mean()) if q.mean() > 0 else q


def mixed_lengths(parts: list[tuple[float, TurnCount | None]], assumed_prompt: float, n: int = 2000) -> list:
    """Sources priced apart -> about `n` prompt lengths distributed as their mix (each source's sample
    spread over its share of the sequences, as `combined` weighs them; a source not read at
    `assumed_prompt`)."""
    total = sum(w * (t.turns_per_conversation if t else 1.0) for w, t in parts)
    out = []
    for w, t in parts:
        k = round(n * w * (t.turns_per_conversation if t else 1.0) / total)
        out += [assumed_prompt] * k if t is None else list(spread(t.prompt_lengths, k, t.mean_prompt))
    return out


def conversation_tokens(
    recipe: Recipe,
    rows: list[dict],
    new: float,
    chars_per_token: float,
    kept_fraction_harmony: float,
    is_gpt_oss: bool,
    tokenizer: tuple | None = None,
) -> TurnCount:
    """Answered turns and prompt lengths of `rows`, a prompts stage's training conversations (--run's
    RUN/prompts/train.jsonl, or one source's sample: source_samples; CPU only, before any GPU).
    `tokenizer`: plan_tokenizer's (tokenizer, why), loaded here when None.

    Every conversation's user turns are counted (at most data.max_turns); a seeded sample of
    the conversations (all of them up to SAMPLED_CONVERSATIONS) is rendered with the target's chat
    template as regeneration renders it, turn by turn, with each prompt's reasoning effort, every earlier
    answer standing in as `new` generated tokens of which the template keeps a share (a harmony template:
    `kept_fraction_harmony`, the final channel; any other: all). A conversation stops where regeneration
    stops it at a prompt over data.max_prompt_tokens; the share of turns that fit in the sample scales the
    count. An answer cut at data.max_new_tokens also ends its conversation in regeneration: not modelled,
    so the count is an upper bound. Without a tokenizer the turns are still counted and each prompt's length
    is estimated from its characters (estimated_prompt_lengths)."""
    from eyas.data.chat import effort_kwargs, is_harmony, reasoning_effort, split_turns  # lazy: torch

    d = recipe.data
    turns = [split_turns(r["messages"]) for r in rows]
    if d.max_turns is not None:  # a recipe that asks fewer turns than the run's prompts stage kept
        turns = [(system, users[: d.max_turns]) for system, users in turns]
    user_turns = sum(len(users) for _, users in turns)
    tok, why = tokenizer or plan_tokenizer(recipe)
    harmony = is_harmony(tok) if tok is not None else is_gpt_oss
    kept = new * (kept_fraction_harmony if harmony else 1.0)
    picked = random.Random(d.seed).sample(range(len(rows)), min(len(rows), SAMPLED_CONVERSATIONS))
    asked, sampled_turns, prompt_tokens, every = 0, 0, 0.0, []
    for i in picked:
        system, users = turns[i]
        if tok is None:
            lengths = estimated_prompt_lengths(system, users, kept, d.max_prompt_tokens, chars_per_token)
        else:
            effort = effort_kwargs(reasoning_effort(d.reasoning_effort, d.seed, rows[i]["id"]))
            lengths = turn_prompt_lengths(
                tok, system, users, [kept] * len(users), d.max_prompt_tokens, **effort
            )
        asked, sampled_turns, prompt_tokens = (
            asked + len(lengths),
            sampled_turns + len(users),
            prompt_tokens + sum(lengths),
        )
        every += lengths
    if not asked:
        raise ValueError(
            f"data.max_prompt_tokens={d.max_prompt_tokens}: no first prompt of the "
            f"{len(picked):,} conversations rendered fits under it, so regeneration would "
            "answer none; raise it"
        )
    return TurnCount(
        turns_per_conversation=user_turns / len(rows) * asked / sampled_turns,
        mean_prompt=prompt_tokens / asked,
        rendered=0 if tok is None else len(picked),
        conversations=len(rows),
        user_turns=user_turns,
        kept_answer_tokens=kept,
        no_tokenizer=why,
        prompt_lengths=every,
    )
