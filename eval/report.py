"""RUN/report.md from the report dict (eval/evaluate.py), a function per section; shape_label and
recommendation_table also serve the model card (eyas/model_card.py)."""

from __future__ import annotations

from eyas.eval.buckets import bucket_order


def _f(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "—"


def _ci(interval) -> str:
    return f" ({interval[0]:.3f}–{interval[1]:.3f})" if interval else ""


def shape_label(r: dict) -> str:
    if r.get("tree") is not None:
        return "tree " + ",".join(map(str, r["tree"]))
    return f"k={r['k']}" if r.get("k") is not None else "—"


def report_markdown(r: dict) -> str:
    s = r["eval_settings"]
    unchecked = s.get("check_lossless") is False and 0.0 in s["temperatures"]
    lossless = {True: "true", False: "**false**", None: "— (no greedy rows)"}[r["lossless"]]
    if unchecked:
        lossless = "not checked (eval.check_lossless: false)"
    lines = [
        "# eyas evaluation report",
        "",
        f"- target: `{r['target']}` on {r['device']}; max_new_tokens {s['max_new_tokens']}; temperatures "
        f"{s['temperatures']} (top-p {s['top_p']}, top-k {s['top_k'] or 'off'}); "
        f"concurrency {s['concurrency']}",
        f"- acceptance length τ = **{_f(r['acceptance_length'], 3)}** ({shape_label(r['results'][0])}, "
        f"{r['num_prompts']} prompts): vLLM's definition, 1 + accepted drafts / verifications",
        f"- lossless: {lossless} (at temperature 0, every speculative output == the target's plain greedy "
        "output, token for token, or parts from it only where the target's own computations disagree)"
        + partings_note(r),
        f"- target mean next-token entropy on its greedy outputs: {_f(r['target_entropy'], 3)} nats",
        "",
        *results_table(r["results"]),
        *category_table(r["results"]),
        *length_table(r["results"]),
        *training_table(r["results"]),
        "",
        "## Recommendation",
        "",
        recommendation_table(r.get("recommendation") or []),
        "",
        *cost_model_lines(r.get("cost_model")),
    ]
    for p in r.get("plots") or []:
        lines += [f"![{p}]({p})", ""]
    lines += ["| stage | wall time (s) |", "|---|---|"]
    lines += [f"| {s_} | {t_} |" for s_, t_ in r["stage_times"].items()]
    return "\n".join(lines) + "\n"


def partings_note(r: dict) -> str:
    """'; 2 numerical partings (gaps 0.06, 0.12), 0 failures' over every greedy row, or nothing."""
    rows = [x for x in r["results"] if x.get("partings") is not None]
    if not rows:
        return ""
    numerical = [p for x in rows for p in x["partings"] if p["kind"] == "numerical"]
    failures = sum(x["failures"] for x in rows)
    gaps = ", ".join(f"{p['gap']:.3g}" for p in numerical[:8]) + (", ..." if len(numerical) > 8 else "")
    return (
        f"; {len(numerical)} numerical parting(s) (plain decoding's lead of its token over the loop's: "
        f"{gaps or '—'}), {failures} failure(s) (eval/verdict.py)"
    )


def results_table(results: list[dict]) -> list[str]:
    """## Results: one line per row of report.json `results`."""
    lines = [
        "## Results",
        "",
        "Output tokens/s over the whole run holding the concurrency level; TTFT from arrival (queueing "
        "included); ITL between consecutive emissions of a request (a speculative emission holds several "
        "tokens); the baseline is the same engine without a draft at the same concurrency and "
        "temperature. τ is vLLM's mean acceptance length, 1 + accepted drafts / verifications, for every "
        "engine; tokens / forward is what was emitted per verification (τ less the verifications a stop "
        "cut short; the only one SGLang reports). τ's brackets: its 95% bootstrap interval over the prompts "
        "(at T > 0 the sampling's noise too).",
        "",
        "| draft | engine | benchmark | T | C | shape | τ | tokens / forward | per-position acceptance "
        "| tok/s | baseline tok/s | speedup | TTFT p50 ms | ITL p50 / p95 ms | lossless |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in results:
        pp = ", ".join(f"{a:.2f}" for a in x["per_position_acceptance"])
        ll = {True: "yes", False: "**no**", None: "—"}[x["lossless"]]
        ll += f" ({x['numerical_partings']} numerical)" if x.get("numerical_partings") else ""
        lines.append(
            f"| {x['draft']} | {x['engine']} | {x['benchmark']} | {x['temperature']:g} | {x['concurrency']} "
            f"| {shape_label(x)} | {_f(x['acceptance_length'], 3)}{_ci(x.get('acceptance_length_ci'))} "
            f"| {_f(x.get('tokens_per_forward'), 3)} | {pp} "
            f"| {_f(x['output_tokens_per_s'], 1)} | {_f(x['baseline_output_tokens_per_s'], 1)} "
            f"| {_f(x['speedup'])}× | {_f(x['ttft_ms_p50'], 1)} "
            f"| {_f(x['itl_ms_p50'], 1)} / {_f(x['itl_ms_p95'], 1)} | {ll} |"
        )
    return lines


def row_table(title: str, names: list[str], rows: list[tuple[dict, list[str]]], intro: str = "") -> list[str]:
    """A "## title" table of result rows (draft, benchmark, T, C, shape) with one column per name."""
    lines = ["", f"## {title}", "", *([intro, ""] if intro else [])]
    lines += ["| draft | benchmark | T | C | shape | " + " | ".join(names) + " |"]
    lines += ["|---|---|---|---|---|" + "---|" * len(names)]
    for x, cells in rows:
        lines.append(
            f"| {x['draft']} | {x['benchmark']} | {x['temperature']:g} | {x['concurrency']} | "
            f"{shape_label(x)} | " + " | ".join(cells) + " |"
        )
    return lines


def category_table(results: list[dict]) -> list[str]:
    """## τ by category, for the rows measured on a benchmark with categories (MT-bench); else none."""
    cats = [x for x in results if x.get("by_category")]
    if not cats:
        return []
    names = list(cats[0]["by_category"])
    rows = [(x, [_f(v["acceptance_length"], 3) for v in x["by_category"].values()]) for x in cats]
    return row_table("τ by category", names, rows)


def length_table(results: list[dict]) -> list[str]:
    """## τ by prompt length, for the rows whose prompts span more than one length bucket; else none. Each
    cell: τ, the per-position acceptance, the prompts in the bucket and (one request at a time) the draft's
    time per round."""
    rows = [x for x in results if len(x.get("by_length") or {}) > 1]
    if not rows:
        return []
    names = bucket_order(b for x in rows for b in x["by_length"])
    intro = (
        "τ (per-position acceptance; prompts; at concurrency 1 the draft's time per round) per bucket of "
        "prompt tokens (K = 1,024)."
    )
    return row_table(
        "τ by prompt length",
        names,
        [(x, [length_cell(x["by_length"].get(b)) for b in names]) for x in rows],
        intro,
    )


def length_cell(v: dict | None) -> str:
    """One bucket of a row: τ (per-position acceptance; prompts[; draft ms per round]), or — where the row has
    no prompt there."""
    if not v:
        return "—"
    pos = " ".join(_f(p, 2) for p in v.get("per_position_acceptance") or [])
    ms = f"; {v['draft_ms_per_round']:.1f} ms" if v.get("draft_ms_per_round") is not None else ""
    return f"{_f(v['acceptance_length'], 3)} ({pos}; {v['num_prompts']}{ms})"


def training_table(results: list[dict]) -> list[str]:
    """Training's simulated τ next to the measured one, for the rows that carry both; else none."""
    sim = [
        x
        for x in results
        if x.get("training_simulated_tau") is not None and x.get("acceptance_length") is not None
    ]
    if not sim:
        return []
    lines = [
        "",
        "## Training's estimate vs the serving loop",
        "",
        "Simulated τ: training's validation on held-out captured sequences (teacher-forced TTT, a chain "
        "of k drafts from every position, greedy at T = 0; at T = 1 the draft's argmax accepted with the "
        "target's probability); replayed τ (greedy): the same chains only where the loop drafts one, after "
        "each round's accepted drafts and bonus token; measured τ: the serving loop at the same temperature.",
        "",
        "| draft | benchmark | T | C | k | simulated τ | replayed τ | measured τ | measured − simulated "
        "| measured − replayed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in sim:
        tau, replayed = x["acceptance_length"], x.get("training_replayed_tau")
        gap = "—" if replayed is None else f"{tau - replayed:+.3f}"
        lines.append(
            f"| {x['draft']} | {x['benchmark']} | {x['temperature']:g} | {x['concurrency']} | {x['k']} | "
            f"{_f(x['training_simulated_tau'], 3)} | {_f(replayed, 3)} | {_f(tau, 3)} | "
            f"{tau - x['training_simulated_tau']:+.3f} | {gap} |"
        )
    return lines


def cost_model_lines(cm: dict | None) -> list[str]:
    """The fitted cost model (eval/advice.py) in one sentence; none without one."""
    if not cm:
        return []
    t, d = cm["target"], cm["draft"]
    return [
        f"Cost model fitted to {cm['num_steps']} iterations: target forward = "
        f"{t['intercept_s'] * 1e3:.3f} ms + {t['per_verified_token_s'] * 1e6:.2f} µs per verified token "
        f"+ {t['per_context_token_s'] * 1e9:.2f} ns per context token; draft = "
        f"{d['per_forward_s'] * 1e3:.3f} ms per forward + {d['per_draft_token_s'] * 1e6:.2f} µs per "
        f"draft token; plain-decoding overhead {cm['plain_overhead_s'] * 1e3:.3f} ms per step.",
        "",
    ]


def recommendation_table(rows: list[dict]) -> str:
    if not rows:
        return "(no eyas-engine results to base a recommendation on)"
    out = [
        "| draft | benchmark | T | concurrency | recommended | predicted speedup | measured speedup "
        "| predicted τ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        out.append(
            f"| {x['draft']} | {x['benchmark']} | {x['temperature']:g} | {x['concurrency']} | "
            f"{'no speculation' if x['k'] == 0 else x['choice']} | {_f(x['predicted_speedup'])}× | "
            f"{_f(x['measured_speedup'])}{'×' if x['measured_speedup'] is not None else ''} | "
            f"{_f(x['predicted_tau'])} |"
        )
    return "\n".join(out)
