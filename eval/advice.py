"""k advice: predict throughput for every chain length and tree shape at every concurrency level
from what the eval measured, and recommend one per concurrency.

Cost model, fitted by least squares to every decoding iteration the eval ran (engine StepStats):

    target forward   T_t(B, N, L) = a0 + a1 * B*N + a2 * B*L       B rows, N tokens verified per
                                                                   row, L mean context length
    draft            T_d = d0 * F + d1 * B*W                       F draft forwards per iteration
                                                                   (EAGLE-3: steps - 1 tree levels + the
                                                                   step 0 on the accepted path; P-EAGLE:
                                                                   that step 0 + one forward of the K - 1
                                                                   mask slots), W draft tokens per row
                                                                   (topk*(steps-1) + tau)
    plain decoding   T_b(B, L) = T_t(B, 1, L) + o                  o: its measured per-step overhead

    tau(k)           chains: 1 + sum of the measured per-position acceptance up to k (a position's
                     acceptance does not depend on how many drafts follow it), from the longest
                     measured chain at that temperature, only the rounds the draft trained where
                     its kind serves no other (DraftKind.untrained_k); trees: their measured tau

    speedup(shape, C) = [C * tau / (T_t(C, N) + T_d)] / [C / T_b(C)]     (prefill left out of both)

The recommendation at each concurrency is the shape with the highest predicted speedup, or no
speculation (k = 0) when none beats plain decoding.
"""

from __future__ import annotations

import numpy as np

from eyas.recipes.types import TreeShape
from eyas.train.kinds import DEFAULT_KIND, kind_named


def _lstsq(X: list[list[float]], y: list[float]) -> list[float]:
    if not y:
        return [0.0] * (len(X[0]) if X else 0)
    coef, *_ = np.linalg.lstsq(np.array(X, dtype=float), np.array(y, dtype=float), rcond=None)
    return [max(float(c), 0.0) for c in coef]  # costs are never negative


def fit_cost_model(runs: list[dict]) -> dict:
    """runs: [{"shape": TreeShape | None, "kind": draft kind (default eagle3), "steps": [StepStats]}]; decode
    steps only."""
    tx, ty, dx, dy, overhead = [], [], [], [], []
    for run in runs:
        shape = run["shape"]
        for s in run["steps"]:
            if s.kind != "decode":
                continue
            tx.append([1.0, s.rows * s.tokens_per_row, s.rows * s.context])
            ty.append(s.target_s)
            if shape is None:
                overhead.append(s.total_s - s.target_s)
            else:
                F = kind_named(run.get("kind", DEFAULT_KIND)).draft_forwards(shape)
                W = shape.topk * (shape.steps - 1) + s.emitted / max(s.rows, 1)
                dx.append([F, s.rows * W])
                dy.append(s.total_s - s.target_s)
    a = _lstsq(tx, ty)
    d = _lstsq(dx, dy) if dx else [0.0, 0.0]
    return {
        "target": {"intercept_s": a[0], "per_verified_token_s": a[1], "per_context_token_s": a[2]},
        "draft": {"per_forward_s": d[0], "per_draft_token_s": d[1]},
        "plain_overhead_s": float(np.mean(overhead)) if overhead else 0.0,
        "num_steps": len(ty),
    }


def predict(
    model: dict, shape: TreeShape | None, tau: float, rows: int, context: float, kind: str = DEFAULT_KIND
) -> float:
    """Predicted output tokens/s at `rows` concurrent requests (shape None: plain decoding) with a draft of
    `kind`."""
    t = model["target"]
    N = shape.num_draft_tokens if shape else 1
    target = (
        t["intercept_s"] + t["per_verified_token_s"] * rows * N + t["per_context_token_s"] * rows * context
    )
    if shape is None:
        return rows / max(target + model["plain_overhead_s"], 1e-12)
    d = model["draft"]
    draft_tokens = shape.topk * (shape.steps - 1) + tau  # per row
    draft = (
        d["per_forward_s"] * kind_named(kind).draft_forwards(shape)
        + d["per_draft_token_s"] * rows * draft_tokens
    )
    return rows * tau / max(target + draft, 1e-12)


def candidate_taus(results: list[dict]) -> dict[str, tuple[TreeShape, float]]:
    """label -> (shape, tau) for chains up to the longest measured one and every measured tree.
    `results`: eval entries of one (draft, benchmark, temperature), any concurrency."""
    out: dict[str, tuple[TreeShape, float]] = {}
    chains = [r for r in results if r.get("tree") is None and r.get("k")]
    if chains:
        longest = max(chains, key=lambda r: (r["k"], r["target_forwards"]))
        pp = longest["per_position_acceptance"]
        kind = kind_named(longest.get("draft_kind", DEFAULT_KIND))
        for k in range(1, len(pp) + 1):
            if kind.untrained_k(longest.get("trained_k"), k):  # a round the draft would refuse to serve
                continue
            shape = TreeShape.chain(k)
            out[shape.label] = (shape, 1.0 + sum(pp[:k]))
    for r in results:
        if r.get("tree") is not None:
            shape = TreeShape(*r["tree"])
            taus = [x["acceptance_length"] for x in results if x.get("tree") == r["tree"]]
            out[shape.label] = (shape, float(np.mean(taus)))
    return out


def recommend(results: list[dict], model: dict, context: float) -> list[dict]:
    """One row per (draft, benchmark, temperature, concurrency) of the eyas-engine results."""
    rows = []
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        if r.get("engine", "eyas") == "eyas":
            groups.setdefault((r["draft"], r["benchmark"], r["temperature"]), []).append(r)
    for (draft, bench, temp), group in groups.items():
        cands = candidate_taus(group)
        kind = group[0].get("draft_kind", DEFAULT_KIND)
        for c in sorted({r["concurrency"] for r in group}):
            base = predict(model, None, 1.0, c, context)
            scored = sorted(
                (
                    (predict(model, s, tau, c, context, kind) / base, label, s, tau)
                    for label, (s, tau) in cands.items()
                ),
                key=lambda x: -x[0],
            )
            best = scored[0] if scored and scored[0][0] > 1.0 else (1.0, "k=0", None, 1.0)
            speedup, label, shape, tau = best
            measured = next(
                (
                    r["speedup"]
                    for r in group
                    if r["concurrency"] == c and shape is not None and _same(r, shape)
                ),
                None,
            )
            rows.append(
                {
                    "draft": draft,
                    "benchmark": bench,
                    "temperature": temp,
                    "concurrency": c,
                    "k": 0 if shape is None else (shape.steps if shape.is_chain else None),
                    "tree": None if shape is None else shape.to_json(),
                    "choice": label,
                    "predicted_speedup": speedup,
                    "measured_speedup": measured,
                    "predicted_tau": tau,
                    "candidates": {lab: round(sp, 4) for sp, lab, _, _ in scored},
                }
            )
    return rows


def _same(result: dict, shape: TreeShape) -> bool:
    if shape.is_chain:
        return result.get("tree") is None and result.get("k") == shape.steps
    return result.get("tree") == shape.to_json()
