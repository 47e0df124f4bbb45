"""The turns of a run's prompts stage for `eyas plan --run`: the target's tokenizer (a local copy or the
hub cache first, then the hub), each turn's prompt length as regeneration renders it with the chat
template, and the answered turns and mean prompt of the run's conversations."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eyas.infra.io import read_jsonl

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


def assumed_prompt_lengths(first: float, turns: int, kept: float, limit: int) -> list[float]:
    """turn_prompt_lengths without a tokenizer: the first turn's prompt assumed, each later one holding
    the earlier answers' kept part; stops before the first turn longer than `limit`."""
    lengths = []
    for t in range(turns):
        if first + t * kept > limit:
            break
        lengths.append(first + t * kept)
    return lengths


def conversation_tokens(
    recipe: Recipe,
    run_dir: Path,
    new: float,
    mean_prompt_tokens: float,
    kept_fraction_harmony: float,
    is_gpt_oss: bool,
) -> TurnCount:
    """Answered turns and prompt lengths from a run whose prompts stage is done (CPU only, before any GPU).

    Every training conversation's user turns are counted (at most data.max_turns); a seeded sample of
    the conversations (all of them up to SAMPLED_CONVERSATIONS) is rendered with the target's chat
    template as regeneration renders it, turn by turn, with each prompt's reasoning effort, every earlier
    answer standing in as `new` generated tokens of which the template keeps a share (a harmony template:
    `kept_fraction_harmony`, the final channel; any other: all). A conversation stops where regeneration
    stops it at a prompt over data.max_prompt_tokens; the share of turns that fit in the sample scales the
    count. An answer cut at data.max_new_tokens also ends its conversation in regeneration: not modelled,
    so the count is an upper bound. Without a tokenizer the turns are still counted and the first prompt
    is `mean_prompt_tokens`."""
    from eyas.data.chat import effort_kwargs, is_harmony, reasoning_effort, split_turns  # lazy: torch

    d = recipe.data
    rows = read_jsonl(Path(run_dir) / "prompts" / "train.jsonl")
    if not rows:
        raise ValueError(f"--run {run_dir}: its prompts stage holds no training conversations")
    turns = [split_turns(r["messages"]) for r in rows]
    if d.max_turns is not None:  # a recipe that asks fewer turns than the run's prompts stage kept
        turns = [(system, users[: d.max_turns]) for system, users in turns]
    user_turns = sum(len(users) for _, users in turns)
    tok, why = plan_tokenizer(recipe)
    harmony = is_harmony(tok) if tok is not None else is_gpt_oss
    kept = new * (kept_fraction_harmony if harmony else 1.0)
    picked = random.Random(d.seed).sample(range(len(rows)), min(len(rows), SAMPLED_CONVERSATIONS))
    asked, sampled_turns, prompt_tokens = 0, 0, 0.0
    for i in picked:
        system, users = turns[i]
        if tok is None:
            first = min(mean_prompt_tokens, d.max_prompt_tokens)
            lengths = assumed_prompt_lengths(first, len(users), kept, d.max_prompt_tokens)
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
    )
