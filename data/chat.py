"""Chat-template helpers every stage uses: the prompt's token ids, the end-of-sequence and pad ids, the
reasoning effort, the harmony (gpt-oss) answer format, and left padding for batched generation.

A leaf: it imports nothing of eyas's (regeneration, capture, serving, eval, plan and the demo target
import it).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping

import torch


def render_prompt(
    tokenizer, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs
) -> list[int]:
    """The chat-template token ids of `messages`, by default followed by the assistant
    generation prompt (whatever container this transformers version returns). `template_kwargs`
    reach the template (gpt-oss: reasoning_effort)."""
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, **template_kwargs
    )
    ids = out["input_ids"] if isinstance(out, Mapping) else out
    return [int(t) for t in ids]


def eos_token_ids(model, tokenizer) -> list[int]:
    """End-of-sequence ids: the target's generation config (gpt-oss: <|return|>, <|call|>, …),
    else the tokenizer's eos token."""
    return generation_eos_ids(model.generation_config, tokenizer, model.name_or_path)


def generation_eos_ids(generation_config, tokenizer, name: str) -> list[int]:
    eos = generation_config.eos_token_id if generation_config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(
            f"{name}: neither the generation config nor the tokenizer names an "
            "eos token, so generations could never finish"
        )
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


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


def cut_at_eos(tokens: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    """-> (tokens up to and including the first eos, whether an eos was found)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1], True
    return tokens, False


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> input_ids, attention_mask (B, L), left padded to the longest prompt (for `generate`)."""
    B, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p) :] = torch.tensor(p)
        mask[b, L - len(p) :] = 1
    return ids, mask


def split_turns(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """A prompts-stage row's messages -> (the messages before the first user turn, the user turns)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[:first], [m for m in messages[first:] if m["role"] == "user"]


HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")


def is_harmony(tokenizer) -> bool:
    """gpt-oss's harmony format: answers are channel messages (analysis, final), with the header tokens
    <|start|>, <|channel|>, <|message|> and <|end|> in the vocabulary."""
    vocab = tokenizer.get_vocab()
    return all(t in vocab for t in HARMONY_TOKENS[:4])


HARMONY_MESSAGE = re.compile(
    r"<\|channel\|>([^<]*)<\|message\|>(.*?)(?=<\|end\|>|<\|return\|>|<\|call\|>|<\|start\|>|$)", re.DOTALL
)


def answer_message(tokenizer, generated: list[int], eos_ids: list[int], harmony: bool | None = None) -> dict:
    """The assistant message for a generated answer, as a chat template takes it to put the answer into
    a later turn's context. Harmony (gpt-oss): the final channel is the content and the analysis channel
    the `thinking` (which gpt-oss's template drops from earlier turns); otherwise the decoded text.
    `harmony`: is_harmony(tokenizer), when the caller knows it already."""
    if is_harmony(tokenizer) if harmony is None else harmony:
        text = tokenizer.decode(generated, skip_special_tokens=False)
        channels: dict[str, list[str]] = {}
        for channel, body in HARMONY_MESSAGE.findall(text):
            channels.setdefault((channel.split() or [""])[0], []).append(body)
        if channels:
            last = list(channels.values())[-1][-1]
            msg = {"role": "assistant", "content": "".join(channels.get("final", [last]))}
            if "analysis" in channels:
                msg["thinking"] = "".join(channels["analysis"])
            return msg
    eos = set(eos_ids)
    body = generated[:-1] if generated and generated[-1] in eos else generated
    return {"role": "assistant", "content": tokenizer.decode(body, skip_special_tokens=True)}
