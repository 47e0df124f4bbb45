"""How good the demo target is: greedy answers to held-out prompts, measured three ways.

- well_formed: the generation is exactly one harmony answer,
  `<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final<|message|>A<|return|>`
  (R, A without special tokens), within the token budget;
- correct: its final answer A equals the reference answer;
- mean_entropy: the mean entropy (nats) of the target's next-token distribution at each token
  of its own greedy generations, through <|return|>. Near 0 would make the target trivially
  predictable; the demo aims at a few tenths of a nat.
"""

from __future__ import annotations

import re

import torch

from eyas.data.chat import left_pad, render_prompt

_TEXT = r"(?:(?!<\|).)*"  # text without special tokens
ANSWER = re.compile(
    rf"<\|channel\|>analysis<\|message\|>(?P<analysis>{_TEXT})<\|end\|>"
    rf"<\|start\|>assistant<\|channel\|>final<\|message\|>(?P<final>{_TEXT})<\|return\|>",
    re.DOTALL,
)


def parse_answer(text: str) -> tuple[str, str] | None:
    """A generation decoded with its special tokens -> (analysis, final), or None if malformed."""
    m = ANSWER.fullmatch(text)
    return (m["analysis"], m["final"]) if m else None


@torch.no_grad()
def greedy_generate(
    model, tokenizer, prompts: list[list[dict]], max_new_tokens: int
) -> tuple[list[list[int]], float]:
    """Greedy answers to chat `prompts` (one left-padded batch). -> (per prompt the generated ids,
    cut after the first eos; mean next-token entropy in nats over all those positions)."""
    ids, mask = left_pad([render_prompt(tokenizer, p) for p in prompts], tokenizer.pad_token_id)  # (B, L)
    B, L = ids.shape
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[:, L:]  # (B, n_new)
    logp = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # (B, n_new, V)
    entropy = -(logp.exp() * logp).sum(-1)  # (B, n_new)
    gens, total, count = [], 0.0, 0
    for b in range(B):
        row = new[b].tolist()
        n = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        gens.append(row[:n])
        total += entropy[b, :n].sum().item()
        count += n
    return gens, total / max(count, 1)


def measure(model, tokenizer, records: list[dict], max_new_tokens: int = 160) -> dict:
    """Greedy-answer the user turns of `records` (messages records with reference answers)
    and score them. -> {"num_prompts", "well_formed", "correct", "mean_entropy", token counts}."""
    prompts = [[m for m in r["messages"] if m["role"] != "assistant"] for r in records]
    gens, mean_entropy = greedy_generate(model, tokenizer, prompts, max_new_tokens)
    parsed = [parse_answer(tokenizer.decode(g, skip_special_tokens=False)) for g in gens]
    correct = [p is not None and p[1] == r["messages"][-1]["content"] for p, r in zip(parsed, records)]
    n = len(records)
    return {
        "num_prompts": n,
        "well_formed": sum(p is not None for p in parsed) / n,
        "correct": sum(correct) / n,
        "mean_entropy": round(mean_entropy, 4),
        "mean_generated_tokens": sum(map(len, gens)) / n,
        "max_new_tokens": max_new_tokens,
        "examples": [tokenizer.decode(g, skip_special_tokens=False) for g in gens[:3]],
    }
