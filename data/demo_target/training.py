"""Training the demo target: next-token loss on the assistant turn of chat-rendered conversations.

Each batch is fresh conversations (no example is seen twice), rendered with the chat template,
right padded, with the loss only on the tokens after the generation prompt `<|start|>assistant`
(the analysis channel, the final channel and `<|return|>`). AdamW, linear warmup, cosine decay.
"""

from __future__ import annotations

import math
import random
import time

import torch
from tqdm.auto import tqdm

IGNORE = -100  # label of positions without loss


def encode(tokenizer, records: list[dict]) -> list[tuple[list[int], int]]:
    """Per messages record -> (token ids of the whole rendered conversation, length of its prompt
    part: everything up to and including the generation prompt before the last message)."""
    full = [tokenizer.apply_chat_template(r["messages"], tokenize=False) for r in records]
    prompts = [
        tokenizer.apply_chat_template(r["messages"][:-1], tokenize=False, add_generation_prompt=True)
        for r in records
    ]
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    for ids, prompt in zip(full_ids, prompt_ids):
        if ids[: len(prompt)] != prompt:
            raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
    return [(ids, len(prompt)) for ids, prompt in zip(full_ids, prompt_ids)]


def make_batches(
    examples: list[tuple[list[int], int]], batch_size: int, pad_id: int, seed: int
) -> list[dict[str, torch.Tensor]]:
    """Batches of `batch_size` examples of similar length (sorted within groups of 16 batches,
    less padding), in a seeded random order. Each: input_ids, labels, attention_mask, all (B, T)."""
    group = 16 * batch_size
    chunks = []
    for g in range(0, len(examples), group):
        ordered = sorted(examples[g : g + group], key=lambda e: len(e[0]))
        chunks += [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    random.Random(seed).shuffle(chunks)
    batches = []
    for chunk in chunks:
        T = max(len(ids) for ids, _ in chunk)
        input_ids = torch.full((len(chunk), T), pad_id, dtype=torch.long)  # (B, T)
        labels = torch.full((len(chunk), T), IGNORE, dtype=torch.long)  # (B, T), unshifted: the model shifts
        mask = torch.zeros((len(chunk), T), dtype=torch.long)  # (B, T)
        for b, (ids, prompt_len) in enumerate(chunk):
            row = torch.tensor(ids)
            input_ids[b, : len(ids)] = row
            labels[b, prompt_len : len(ids)] = row[prompt_len:]
            mask[b, : len(ids)] = 1
        batches.append({"input_ids": input_ids, "labels": labels, "attention_mask": mask})
    return batches


def train(
    model, batches: list[dict[str, torch.Tensor]], lr: float, warmup: int, progress: bool = True
) -> dict:
    """One pass over `batches` (at least one), one optimizer step each. -> training metrics
    (first_loss; final_loss, the mean over the last tenth of the steps)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    steps = len(batches)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    t0, losses = time.time(), []
    bar = tqdm(batches, desc="train demo target", unit="step", disable=not progress)
    for step, batch in enumerate(bar):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    model.eval()
    tail = losses[-max(1, steps // 10) :]
    return {
        "steps": steps,
        "batch_size": len(batches[0]["input_ids"]),
        "lr": lr,
        "first_loss": losses[0],
        "final_loss": sum(tail) / len(tail),
        "train_s": round(time.time() - t0, 1),
    }
