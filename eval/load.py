"""Holding a concurrency level: C requests in flight until every prompt is answered, and what
a serving user measures from it.

    output tokens/s   generated tokens of all requests / wall time from the first arrival to the
                      last token
    TTFT              a request's first token time - its arrival (waiting for a free row included)
    ITL               time between consecutive emissions of a request (vLLM's benchmark_serving
                      definition: a speculative emission carries several tokens at once)
    TPOT              (last token time - first token time) / (tokens - 1), per request
    tau               vLLM's mean acceptance length: 1 + accepted drafts / verifications, over all
                      requests (drafts that eos / max_tokens cut off count as accepted, as vLLM counts)
    tokens/forward    what the verifications emitted, per verification (SGLang's count)
    per-position      fraction of verifications that accepted >= s drafts

Both the built-in engine (`run_engine`) and an external OpenAI-compatible server
(eval/server_client.py) produce `LoadResult`s, so their rows sit side by side in one report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from eyas.eval.buckets import bucket_order, length_bucket
from eyas.serve.decoding.engine import Engine, Request
from eyas.serve.decoding.sampling import SamplingParams


@dataclass
class LoadResult:
    outputs: list[list[int]]  # per prompt, generated token ids
    wall_s: float
    ttft_s: list[float]
    itl_s: list[float]
    tpot_s: list[float]
    # speculative acceptance (None without speculation)
    emitted: list[list[int]] | None = None  # per prompt, per verification
    accepted: list[list[int]] | None = None
    steps: list = field(default_factory=list)  # engine StepStats (cost model)

    @property
    def generated(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / max(self.wall_s, 1e-9)


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None  # seconds -> ms


def counters_from_loop(emitted: list[list[int]], accepted: list[list[int]], k: int) -> dict:
    """eyas's per-verification counts -> vLLM's counters (eval/side_by_side.py)."""
    a = [x for row in accepted for x in row]
    return {
        "drafts": len(a),
        "draft_tokens": k * len(a),
        "accepted": sum(a),
        "per_pos": [sum(x > i for x in a) for i in range(k)],
        "emitted": sum(x for row in emitted for x in row),
    }


def rates(c: dict) -> dict:
    """Counters -> tau (vLLM's definition), per-position acceptance, and tokens per forward when known."""
    d = c["drafts"]
    out = {
        "tau": 1 + c["accepted"] / d if d else None,
        "per_position_acceptance": [n / d if d else 0.0 for n in c["per_pos"]],
    }
    if "emitted" in c:
        out["tokens_per_forward"] = c["emitted"] / d if d else None
    return out


RESAMPLES = 2000  # bootstrap draws of the prompts for tau's interval
LEVEL = 0.95


def tau_interval(accepted: list[list[int]], seed: int = 0) -> list[float] | None:
    """tau's 95% percentile-bootstrap interval over prompts: the prompts drawn with replacement RESAMPLES
    times, tau = 1 + their accepted drafts / their verifications each time -> [lo, hi]; None under 2 prompts.
    At T > 0 each prompt's answer is one sample, so the interval holds the sampling noise and the prompts'
    spread together: a lead between two rows is claimed only beyond it (for rows over the same prompts,
    paired: bootstrap_interval over tau_draws of each)."""
    acc, rounds = per_prompt(accepted)
    return bootstrap_interval(lambda idx: tau_draws(acc, rounds, idx), len(accepted), seed)


def per_prompt(accepted: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: (accepted drafts, verifications)."""
    return (
        np.array([sum(x) for x in accepted], dtype=np.float64),
        np.array([len(x) for x in accepted], dtype=np.float64),
    )


def tau_draws(acc: np.ndarray, rounds: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """tau over each draw of prompts: acc, rounds (prompts,) per-prompt counts; idx (draws, n) prompt indices
    -> (draws,)."""
    return 1 + acc[idx].sum(1) / np.maximum(rounds[idx].sum(1), 1)


def tau_difference_interval(
    a: tuple[list[int], list[int]], b: tuple[list[int], list[int]], seed: int = 0
) -> list[float] | None:
    """tau(a) - tau(b) for two rows over the same prompts, a and b each (per_prompt_accepted,
    per_prompt_verifications): its 95% interval over the same bootstrap draws of the prompts for both (paired:
    what the prompts share cancels) -> [lo, hi]; None under 2 prompts."""
    (acc_a, rounds_a), (acc_b, rounds_b) = (tuple(np.asarray(x, dtype=np.float64) for x in r) for r in (a, b))
    if len(acc_a) != len(acc_b):
        raise ValueError(f"paired rows over {len(acc_a)} and {len(acc_b)} prompts: not the same prompts")
    diff = lambda idx: tau_draws(acc_a, rounds_a, idx) - tau_draws(acc_b, rounds_b, idx)  # noqa: E731
    return bootstrap_interval(diff, len(acc_a), seed)


def bootstrap_interval(stat, n: int, seed: int = 0) -> list[float] | None:
    """The 95% percentile interval of `stat(idx)` over RESAMPLES draws of n prompts with replacement (idx:
    (RESAMPLES, n) indices; the same draws for every row a statistic compares: paired) -> [lo, hi]."""
    if n < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, n, size=(RESAMPLES, n))
    lo, hi = np.quantile(stat(idx), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(lo), float(hi)]


def acceptance(
    emitted: list[list[int]], accepted: list[list[int]], depth: int, select: list[bool] | None = None
) -> dict:
    """tau, per-position acceptance (positions 1..depth) and counts over the selected prompts.

    tau is vLLM's mean acceptance length, 1 + accepted drafts / verifications (the drafts a stop cut
    off count as accepted, as vLLM's scheduler counts them), so a row of eyas's loop and a row
    read from vLLM's /metrics mean the same thing; `tokens_per_forward` is what the loop emitted per
    verification (SGLang's count): tau less, per verification, the bonus token and the accepted drafts a
    stop cut off (`cut_verifications`, `cut_drafts`); `acceptance_length_ci`: tau's 95% bootstrap interval
    over the prompts (tau_interval); `per_prompt_accepted`, `per_prompt_verifications`: the counts each
    prompt adds, for paired comparisons of rows (tau_difference_interval)."""
    rows = [i for i in range(len(emitted)) if select is None or select[i]]
    e, a = [emitted[i] for i in rows], [accepted[i] for i in rows]
    r = rates(counters_from_loop(e, a, depth))
    return {
        "acceptance_length": r["tau"],
        "acceptance_length_ci": tau_interval(a),
        "per_prompt_accepted": [sum(x) for x in a],
        "per_prompt_verifications": [len(x) for x in a],
        "tokens_per_forward": r["tokens_per_forward"],
        "per_position_acceptance": r["per_position_acceptance"],
        "target_forwards": sum(map(len, a)),
        "cut_verifications": sum(x <= y for ei, ai in zip(e, a) for x, y in zip(ei, ai)),  # no bonus token
        "cut_drafts": sum(
            y - x for ei, ai in zip(e, a) for x, y in zip(ei, ai) if x <= y
        ),  # accepted, cut off
        "num_prompts": len(rows),
    }


def by_length(
    emitted: list[list[int]],
    accepted: list[list[int]],
    depth: int,
    lengths: list[int],
    draft_rounds: list[tuple[float, int]] | None = None,
) -> dict:
    """acceptance() per prompt-length bucket (length_bucket of each prompt's token count), shortest first;
    with `draft_rounds` (each prompt's draft seconds and rounds: draft_time_by_prompt) also the bucket's
    draft time per round, `draft_ms_per_round`."""
    labels = [length_bucket(n) for n in lengths]
    out = {b: acceptance(emitted, accepted, depth, [x == b for x in labels]) for b in bucket_order(labels)}
    for b, entry in out.items() if draft_rounds else ():
        mine = [draft_rounds[i] for i, x in enumerate(labels) if x == b]
        entry["draft_ms_per_round"] = 1e3 * sum(s for s, _ in mine) / max(sum(n for _, n in mine), 1)
    return out


def draft_time_by_prompt(steps: list) -> list[tuple[float, int]] | None:
    """One request at a time (every step one row, prompts in order): each prompt's (seconds of its decode
    steps outside the target's verification, decode steps): the draft's tree, its step over the accepted
    path and the bookkeeping. None when requests shared steps (concurrency > 1: no step is one prompt's)."""
    if not steps or any(s.rows != 1 for s in steps):
        return None
    out: list[list] = []
    for s in steps:
        if s.kind == "prefill":
            out.append([0.0, 0])
        else:
            out[-1][0] += s.total_s - s.target_s
            out[-1][1] += 1
    return [(t, n) for t, n in out]


def request_latencies(
    token_times: list[float], arrival: float
) -> tuple[float | None, list[float], float | None]:
    """-> (ttft, inter-emission gaps, tpot) of one request from its token emission times."""
    if not token_times:
        return None, [], None
    emissions = sorted(set(token_times))
    itl = [b - a for a, b in zip(emissions, emissions[1:])]
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else None
    return token_times[0] - arrival, itl, tpot


def run_engine(
    engine: Engine, prompts: list[list[int]], params: list[SamplingParams], concurrency: int, progress=None
) -> LoadResult:
    """Keep `concurrency` requests in flight on `engine` until every prompt is answered: a new
    request arrives as soon as one finishes (at the next step boundary)."""
    todo = list(range(len(prompts)))[::-1]
    reqs: dict[int, Request] = {}
    in_flight: set[int] = set()
    engine.stats.clear()
    t0 = time.perf_counter()
    while todo or in_flight:
        while todo and len(in_flight) < concurrency:
            i = todo.pop()
            reqs[i] = engine.add(Request(prompts[i], params[i], id=f"p{i}"))
            in_flight.add(i)
        engine.step()
        done = {i for i in in_flight if reqs[i].finished}
        in_flight -= done
        if progress is not None and done:
            progress.update(len(done))
    wall = max(t for r in reqs.values() for t in r.token_times) - t0
    out = LoadResult(outputs=[], wall_s=wall, ttft_s=[], itl_s=[], tpot_s=[], steps=list(engine.stats))
    spec = engine.draft is not None
    if spec:
        out.emitted, out.accepted = [], []
    for i in range(len(prompts)):
        r = reqs[i]
        if r.error:
            raise RuntimeError(f"prompt {i}: {r.error}")
        out.outputs.append(list(r.tokens))
        ttft, itl, tpot = request_latencies(r.token_times, r.arrival)
        if ttft is not None:
            out.ttft_s.append(ttft)
        out.itl_s += itl
        if tpot is not None:
            out.tpot_s.append(tpot)
        if spec:
            out.emitted.append(list(r.emitted))
            out.accepted.append(list(r.accepted))
    return out


def round_times(steps: list) -> dict:
    """Mean milliseconds per decode round (one verification of every row in flight): the target's forward and
    the rest (the draft's proposal, its step over the accepted path, bookkeeping), from profiled StepStats."""
    rounds = [s for s in steps or [] if s.kind == "decode"]
    if not rounds:
        return {}
    target = sum(s.target_s for s in rounds) / len(rounds)
    total = sum(s.total_s for s in rounds) / len(rounds)
    return {"target_ms_per_round": 1e3 * target, "draft_ms_per_round": 1e3 * (total - target)}
