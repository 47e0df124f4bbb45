"""The loop's lossless verdict: in fp32 a parting is a failure; where the target computes in bf16 (or fp16),
a parting is classified, not just counted.

Greedy speculative decoding must emit exactly the target's plain greedy output. In fp32 it does, token for
token. In bf16 it may not, with no bug anywhere: the loop computes every token's logits and cache entries
in forwards of (k+1) tokens, plain decoding in forwards of one, and bf16 rounds the two differently (on a
CPU a one-row matmul takes another kernel than a several-row one). Where the top two logits are close,
the two computations can pick different tokens, and the outputs part there. So at the first token where a
speculative output parts from the greedy reference, the target is computed again at that token
(`computations`):

    plain          as plain decoding ran: the prompt prefilled, then one token per forward (its argmax
                   is the reference's token)
    verification   the loop's way: everything before the verification that emitted the token prefilled,
                   then one forward of the verification's width (k + 1; a tree's node count, in a row)
    stepped        from that prefill, the verification's tokens one per forward (the one-token step)

    numerical   the target computed the loop's way (verification), or stepped from the same prefill,
                ranks the loop's token first: the target's own computations disagree there
    failure     neither does: the target would not have emitted that token

`gap` is plain decoding's lead of its token over the loop's (logits), `shift` how far the verification's
way moves that margin. The report says lossless only with no failure, and gives the numerical partings with
their gaps. In fp32 (`exact`) nothing is classified: the loop is exact there, so every parting is a failure,
a near-tie included (its small gap is what a loop bug that flips near-ties shows).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from eyas.data.target import input_device
from eyas.recipes.defaults import PREFILL_TOKENS
from eyas.serve.decoding.reference import prefill


@dataclass
class Parting:
    prompt: int  # index of the prompt in its benchmark
    at: int  # index of the first differing generated token
    loop_token: int | None  # None: the loop's output ended there
    greedy_token: int | None
    gap: float | None  # plain decoding's logit(greedy token) - logit(loop token)
    shift: float | None  # the verification's margin - plain decoding's margin
    kind: str  # "numerical" | "failure"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two outputs differ (one ending first counts), None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def round_start(emitted: list[int], at: int) -> int:
    """The generated index of the first token the verification that emitted token `at` emitted (0: the
    prefill's token). `emitted`: tokens per verification, in order; token 0 comes from the prefill."""
    start = 1
    for e in emitted:
        if at < start + e:
            return start
        start += e
    return start


@torch.no_grad()
def _logits(model, cache, ids: list[int], start: int) -> tuple[torch.Tensor, object]:
    """One forward of `ids` at positions start.. after `cache` -> (fp32 logits (len(ids), V), the cache)."""
    dev = input_device(model)
    x = torch.tensor([ids], device=dev)
    pos = torch.arange(start, start + len(ids), device=dev)[None]
    out = model(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True)
    return out.logits[0].float(), out.past_key_values


def _one_at_a_time(model, context: list[int], before: int, upto: int, chunk: int) -> torch.Tensor:
    """Logits (V,) after context[:upto]: a prefill of context[:before] (in chunks of `chunk`,
    reference.prefill), then one token per forward."""
    logits, cache = prefill(model, context[:before], chunk)
    for j in range(before, upto):
        logits, cache = _logits(model, cache, [context[j]], j)
        logits = logits[-1]
    return logits


def computations(
    model, prompt: list[int], output: list[int], at: int, start: int, width: int, chunk: int = PREFILL_TOKENS
) -> dict[str, torch.Tensor]:
    """The target's next-token logits (V,) for generated token `at`, computed three ways:

    plain          as plain greedy decoding ran: the prompt prefilled, then one token per forward
    verification   the loop's way: everything before the verification that emitted token `at` (it began
                   at generated token `start`) prefilled, then one forward of `width` tokens: the fed
                   tokens up to `at`, then the output's next tokens (past its end, its last one again)
    stepped        from that same prefill, the fed tokens one per forward (the one-token step)
    Every prefill goes in chunks of `chunk` tokens, as the loop's does (eval.prefill_tokens)."""
    context, end = prompt + output, len(prompt) + at
    plain = _one_at_a_time(model, context, len(prompt), end, chunk)
    before = len(prompt) + start - 1 if at else len(prompt) - 1  # the fed tokens begin here
    if at == 0:  # the prefill emitted it: the prompt prefilled (in chunks, as the loop does)
        verification = prefill(model, prompt, chunk)[0]
    else:
        block = context[before : before + width]
        block += block[-1:] * (width - len(block))
        _, cache = prefill(model, context[:before], chunk)
        verification = _logits(model, cache, block, before)[0][end - 1 - before]
    return {
        "plain": plain,
        "verification": verification,
        "stepped": _one_at_a_time(model, context, before, end, chunk),
    }


def classify(
    model,
    prompt: list[int],
    output: list[int],
    reference: list[int],
    emitted: list[int],
    width: int,
    index=0,
    exact: bool = False,
    chunk: int = PREFILL_TOKENS,
) -> Parting | None:
    """The parting of a greedy speculative `output` from the greedy `reference` (None: equal). `exact` (an
    fp32 target): a failure whatever the computations say, with its gap and shift."""
    at = first_difference(output, reference)
    if at is None:
        return None
    mine = output[at] if at < len(output) else None
    theirs = reference[at] if at < len(reference) else None
    if mine is None or theirs is None:  # one output ended where the other went on: the loop stopped wrongly
        return Parting(index, at, mine, theirs, None, None, "failure")
    ways = computations(model, prompt, output, at, round_start(emitted, at), width, chunk)
    margins = {k: float(v[mine] - v[theirs]) for k, v in ways.items()}
    own = any(int(ways[k].argmax()) == mine for k in ("verification", "stepped"))
    kind = "numerical" if own and not exact else "failure"
    return Parting(
        index, at, mine, theirs, -margins["plain"], margins["verification"] - margins["plain"], kind
    )


def verdict(
    model, prompts, outputs, references, emitted, width: int, exact: bool = False, chunk: int = PREFILL_TOKENS
) -> tuple[int, int, list[dict]]:
    """Every prompt's parting, classified (`exact`: each a failure) -> (numerical partings, failures, the
    partings as dicts)."""
    found = [
        p
        for i, (pr, o, r, e) in enumerate(zip(prompts, outputs, references, emitted))
        if (p := classify(model, pr, o, r, e, width, i, exact, chunk)) is not None
    ]
    return (
        sum(p.kind == "numerical" for p in found),
        sum(p.kind == "failure" for p in found),
        [asdict(p) for p in found],
    )
