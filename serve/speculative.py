"""Chain speculative decoding with an EAGLE-3 draft, greedy verification, batch size 1.

State between iterations (n = tokens in the target's cache):
    target cache : x_0 .. x_{n-1}                     (sliding-window layers included)
    pending      : x_n, the last emitted token, not yet run through the target
    draft cache  : step-0 entries for positions 0 .. n-1 (built from the target's own aux states)
    draft next   : d_1, the draft's guess for x_{n+1}, and its prenorm state h

One iteration:
    1. draft chain: d_2 .. d_k from (d_s, h) at positions n+s-1, s = 1..k-1   (k-1 draft forwards)
    2. verify: the target runs [x_n, d_1 .. d_k] at positions n .. n+k in ONE forward;
       t_s = argmax at position n+s predicts x_{n+s+1}
    3. accept the longest prefix with d_{s+1} == t_s (a tokens) and the bonus t_a:
       a + 1 tokens are emitted per target forward
    4. roll back exactly: the target cache drops the k - a rejected entries (its
       sliding-window layers keep their past states for that: `activate_past_recording`),
       the draft cache drops its k - 1 chain entries
    5. draft step 0 on the verified positions n .. n+a: tokens (d_1 .. d_a, bonus) with the
       target's aux states at those positions; its last output gives the next d_1.

The draft's attention pattern here is the one TTT trains (train/ttt.py); the test
tests/test_train_serve_consistency.py holds the two equal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eyas.data.target import HiddenStateTap
from eyas.train.model import Eagle3Draft, KVCache


@dataclass
class SpecOutput:
    tokens: list[int]  # generated token ids (prompt excluded), cut at eos / max_new_tokens
    accepted: list[int] = field(default_factory=list)  # per verification: draft tokens accepted (0..k)
    proposed: list[int] = field(default_factory=list)  # per verification: draft tokens proposed (k)
    seconds: float = 0.0

    @property
    def target_forwards(self) -> int:
        return len(self.accepted)

    @property
    def emitted(self) -> int:
        """Tokens produced by verification forwards (accepted drafts + one bonus each)."""
        return sum(self.accepted) + len(self.accepted)


class TargetRunner:
    """The target with its KV cache and hooks on the aux layers (vLLM ids) and the lm_head input."""

    def __init__(self, model, layer_ids: list[int]):
        from transformers import DynamicCache

        self.model = model
        self.tap = HiddenStateTap(model, layer_ids)
        self.cache = DynamicCache(config=model.config)
        # sliding-window layers must keep their past to be rolled back after a rejection
        self.cache.activate_past_recording()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.no_grad()
    def forward(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `ids`; -> logits (T, V) fp32, aux (T, n_aux*H)."""
        device = self.model.get_output_embeddings().weight.device
        x = torch.tensor([ids], device=device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True)
        return out.logits[0].float(), self.tap.aux[0]

    def rollback(self, n: int) -> None:
        """Drop the last n entries (also trims sliding layers back to their window)."""
        self.cache.crop(-n)

    def close(self) -> None:
        self.tap.remove()


class DraftRunner:
    def __init__(self, draft: Eagle3Draft):
        self.draft = draft
        self.cache = KVCache()

    @torch.no_grad()
    def prefill(self, tokens: list[int], aux: torch.Tensor, start: int) -> tuple[int, torch.Tensor]:
        """Step 0 on verified positions start..start+T-1: tokens[i] follows position start+i,
        aux (T, n_aux*H). -> (guess for the token after the last one, its prenorm (1, 1, H))."""
        d = self.draft
        dev = d.fc.weight.device
        hidden = d.fuse(aux[None].to(dev))
        ids = torch.tensor([tokens], device=dev)
        pos = torch.arange(start, start + len(tokens), device=dev)[None]
        h, logits = d.step(ids, hidden, pos, self.cache)
        return int(d.to_target_ids(logits[0, -1].argmax())), h[:, -1:]

    @torch.no_grad()
    def chain(self, token: int, hidden: torch.Tensor, position: int) -> tuple[int, torch.Tensor]:
        d = self.draft
        dev = d.fc.weight.device
        h, logits = d.step(torch.tensor([[token]], device=dev), hidden, torch.tensor([[position]], device=dev),
                           self.cache)
        return int(d.to_target_ids(logits[0, -1].argmax())), h

    def rollback_to(self, length: int) -> None:
        self.cache.crop(length)


@torch.no_grad()
def speculative_generate(target_model, draft: Eagle3Draft, prompt: list[int], k: int, max_new_tokens: int,
                         eos_ids: set[int] | None = None, runner: DraftRunner | None = None) -> SpecOutput:
    """Greedy speculative decoding; the output equals the target's own greedy output.
    `runner` replaces the draft's proposer (tests use one with a known acceptance pattern)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    eos_ids = set(eos_ids or ())
    t0 = time.perf_counter()
    target = TargetRunner(target_model, draft.config.aux_layer_ids)
    dr = runner or DraftRunner(draft)
    try:
        logits, aux = target.forward(prompt)
        pending = int(logits[-1].argmax())
        out = SpecOutput(tokens=[pending])
        n = len(prompt)
        guess, h = dr.prefill(prompt[1:] + [pending], aux, start=0)
        while pending not in eos_ids and len(out.tokens) < max_new_tokens:
            drafts = [guess]
            for s in range(1, k):
                guess, h = dr.chain(drafts[-1], h, n + s - 1)
                drafts.append(guess)
            logits, aux = target.forward([pending] + drafts)  # positions n .. n+k
            greedy = logits.argmax(-1).tolist()  # greedy[s] follows position n+s
            a = 0
            while a < k and drafts[a] == greedy[a]:
                a += 1
            bonus = greedy[a]
            out.accepted.append(a)
            out.proposed.append(k)
            new = drafts[:a] + [bonus]
            target.rollback(k - a)
            dr.rollback_to(n)
            guess, h = dr.prefill(new, aux[:a + 1], start=n)
            n += a + 1
            pending = bonus
            for t in new:
                out.tokens.append(t)
                if t in eos_ids or len(out.tokens) >= max_new_tokens:
                    break
            if out.tokens[-1] in eos_ids:
                break
    finally:
        target.close()
    out.tokens = out.tokens[:max_new_tokens]
    out.seconds = time.perf_counter() - t0
    return out


@torch.no_grad()
def greedy_generate(target_model, prompt: list[int], max_new_tokens: int, eos_ids: set[int] | None = None
                    ) -> tuple[list[int], float, float]:
    """The target's plain greedy output with Hugging Face `generate`.
    -> (token ids, mean next-token entropy in nats along the output, seconds)."""
    device = target_model.get_output_embeddings().weight.device
    x = torch.tensor([prompt], device=device)
    t0 = time.perf_counter()
    gen = target_model.generate(
        x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=sorted(eos_ids) if eos_ids else None, pad_token_id=target_model.config.pad_token_id,
        output_logits=True, return_dict_in_generate=True, temperature=None, top_p=None, top_k=None)
    seconds = time.perf_counter() - t0
    tokens = gen.sequences[0, len(prompt):].tolist()
    if eos_ids:
        for i, t in enumerate(tokens):
            if t in eos_ids:
                tokens = tokens[:i + 1]
                break
    ents = []
    for step_logits in gen.logits[:len(tokens)]:
        logp = torch.log_softmax(step_logits[0].float(), dim=-1)
        ents.append(float(-(logp.exp() * logp).sum()))
    return tokens, (sum(ents) / len(ents) if ents else 0.0), seconds
