"""The target's own output without speculation, with Hugging Face `generate`: the reference every
speculative output is checked against (greedy: token for token). Long prompts are prefilled in chunks of
`prefill_tokens` (generate's own chunked prefill, with its own cache and masks) through the memory-efficient
attention the loop uses (train/blocked_attention.py), so a 128K-token prompt's reference takes no (q x kv)
tensor either.

    greedy_generate   the reference output, with its mean next-token entropy
    prefill           a context through the target in chunks into a fresh Hugging Face cache (eval/verdict.py)
"""

from __future__ import annotations

import time

import torch

from eyas.data.target import input_device
from eyas.recipes.defaults import PREFILL_TOKENS
from eyas.train.blocked_attention import memory_efficient


@torch.no_grad()
def greedy_generate(
    target_model,
    prompt: list[int],
    max_new_tokens: int,
    eos_ids: set[int] | None = None,
    prefill_tokens: int = PREFILL_TOKENS,
) -> tuple[list[int], float, float]:
    """The target's plain greedy output with Hugging Face `generate`, a prompt longer than `prefill_tokens`
    prefilled in chunks of it.
    -> (token ids cut after the first eos, mean next-token entropy in nats along the output, seconds)."""

    memory_efficient(target_model)
    device = input_device(target_model)  # where the embedding runs, offloaded or not
    x = torch.tensor([prompt], device=device)
    t0 = time.perf_counter()
    gen = target_model.generate(
        x,
        attention_mask=torch.ones_like(x),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        prefill_chunk_size=prefill_tokens if len(prompt) > prefill_tokens else None,
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


@torch.no_grad()
def prefill(model, ids: list[int], prefill_tokens: int = PREFILL_TOKENS, cache=None):
    """`ids` through the target after `cache` (None: a fresh one), in forwards of at most `prefill_tokens`
    -> (fp32 next-token logits (V,) after the last id, the cache); no ids: (None, the cache)."""

    memory_efficient(model)
    dev, start = input_device(model), cache.get_seq_length() if cache is not None else 0
    out = None
    for s in range(0, len(ids), prefill_tokens):
        x = torch.tensor([ids[s : s + prefill_tokens]], device=dev)
        pos = torch.arange(start + s, start + s + x.shape[1], device=dev)[None]
        out = model(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
    return (out.logits[0, -1].float() if out is not None else None), cache
