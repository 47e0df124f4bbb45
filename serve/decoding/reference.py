"""The target's own output without speculation, with Hugging Face `generate`: the reference every
speculative output is checked against (greedy: token for token)."""

from __future__ import annotations

import time

import torch


@torch.no_grad()
def greedy_generate(
    target_model, prompt: list[int], max_new_tokens: int, eos_ids: set[int] | None = None
) -> tuple[list[int], float, float]:
    """The target's plain greedy output with Hugging Face `generate`.
    -> (token ids cut after the first eos, mean next-token entropy in nats along the output, seconds)."""
    from eyas.data.target import input_device

    device = input_device(target_model)  # where the embedding runs, offloaded or not
    x = torch.tensor([prompt], device=device)
    t0 = time.perf_counter()
    gen = target_model.generate(
        x,
        attention_mask=torch.ones_like(x),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=sorted(eos_ids) if eos_ids else None,
        pad_token_id=target_model.config.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    seconds = time.perf_counter() - t0
    tokens = gen.sequences[0, len(prompt) :].tolist()
    if eos_ids:
        for i, t in enumerate(tokens):
            if t in eos_ids:
                tokens = tokens[: i + 1]
                break
    ents = []
    for step_logits in gen.logits[: len(tokens)]:
        logp = torch.log_softmax(step_logits[0].float(), dim=-1)
        ents.append(float(-(logp.exp() * logp).sum()))
    return tokens, (sum(ents) / len(ents) if ents else 0.0), seconds
