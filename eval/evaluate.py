"""`eyas eval`: measure acceptance length τ with the built-in speculative loop.

For every held-out prompt: the target's plain greedy output (Hugging Face `generate`), then
the speculative loop with each draft at each k; the run is `lossless` only if every
speculative output equals the plain greedy output token for token. Writes RUN/report.json
and RUN/report.md (several drafts side by side when given).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eyas import io
from eyas.pipeline import STAGE_ORDER
from eyas.recipes.schema import Recipe

def summarize(name: str, benchmark: str, k: int, runs: list, refs: list[list[int]]) -> dict:
    forwards = sum(r.target_forwards for r in runs)
    emitted = sum(r.emitted for r in runs)
    per_pos = []
    for s in range(1, k + 1):
        per_pos.append(sum(sum(a >= s for a in r.accepted) for r in runs) / max(forwards, 1))
    tokens = sum(len(r.tokens) for r in runs)
    return {
        "draft": name, "benchmark": benchmark, "k": k,
        "acceptance_length": emitted / max(forwards, 1),
        "per_position_acceptance": per_pos,
        "lossless": all(r.tokens == ref for r, ref in zip(runs, refs)),
        "num_mismatched": sum(r.tokens != ref for r, ref in zip(runs, refs)),
        "num_prompts": len(runs),
        "target_forwards": forwards,
        "generated_tokens": tokens,
        "tokens_per_second": tokens / max(sum(r.seconds for r in runs), 1e-9),
    }


def run_eval(recipe: Recipe, run_dir: str | Path, drafts: list[tuple[str, str]] | None = None,
             ks: list[int] | None = None, benchmarks: list[tuple[str, str]] | None = None,
             progress: bool = True, force: bool = False) -> dict:
    """drafts: (name, checkpoint dir) pairs, default the run's own; ks: default [recipe.eval.k];
    benchmarks: (name, prompts file) pairs, default the run's held-out prompts."""
    from eyas.data.prompts import load_conversations, prompt_messages
    from eyas.data.regenerate import eos_token_ids, render_prompt
    from eyas.data.target import load_target
    from eyas.serve.speculative import greedy_generate, speculative_generate
    from eyas.train.checkpoint import load_draft

    run_dir = Path(run_dir)
    if io.is_done(run_dir, "eval") and not force and drafts is None and ks is None and benchmarks is None:
        return json.loads((run_dir / "report.json").read_text())
    t0 = time.perf_counter()
    ev = recipe.eval
    drafts = drafts or [("eyas", str(run_dir / "train" / "checkpoint-final"))]
    ks = ks or [ev.k]
    benchmarks = benchmarks or [("held-out", str(run_dir / "prompts" / "eval.jsonl"))]
    model, tok = load_target(recipe.target.model, recipe.target.dtype, recipe.target.device,
                             recipe.target.trust_remote_code)
    eos = set(eos_token_ids(model, tok))
    dtype = next(model.parameters()).dtype
    device = model.get_output_embeddings().weight.device
    loaded = [(name, load_draft(path, device=device, dtype=dtype if dtype != torch.float16 else torch.float32).eval())
              for name, path in drafts]

    results, entropies, base_tokens, base_seconds = [], [], 0, 0.0
    for bench, path in benchmarks:
        convs = load_conversations(path)
        if ev.num_prompts:
            convs = convs[:ev.num_prompts]
        prompts = [render_prompt(tok, prompt_messages(c, recipe.data.system_prompt)) for c in convs]
        refs = []
        for p in tqdm(prompts, desc=f"eval {bench}: target greedy", disable=not progress):
            ref, ent, sec = greedy_generate(model, p, ev.max_new_tokens, eos)
            refs.append(ref)
            entropies.append(ent)
            base_tokens += len(ref)
            base_seconds += sec
        for name, draft in loaded:
            for k in ks:
                runs = [speculative_generate(model, draft, p, k, ev.max_new_tokens, eos)
                        for p in tqdm(prompts, desc=f"eval {bench}: {name} k={k}", disable=not progress)]
                results.append(summarize(name, bench, k, runs, refs))

    main = results[0]
    baseline_tps = base_tokens / max(base_seconds, 1e-9)
    stage_times = {s: io.read_done(run_dir, s).get("wall_s") for s in STAGE_ORDER[:-1] if io.is_done(run_dir, s)}
    stage_times["eval"] = round(time.perf_counter() - t0, 2)
    report = {
        "acceptance_length": main["acceptance_length"],
        "k": main["k"],
        "per_position_acceptance": main["per_position_acceptance"],
        "lossless": all(r["lossless"] for r in results),
        "num_prompts": main["num_prompts"],
        "tokens_per_second": {"speculative": main["tokens_per_second"], "baseline": baseline_tps},
        "speedup": main["tokens_per_second"] / max(baseline_tps, 1e-9),
        "target_entropy": sum(entropies) / max(len(entropies), 1),
        "stage_times": stage_times,
        "target": recipe.target.model,
        "draft": drafts[0][1],
        "device": str(device),
        "eval_settings": {"max_new_tokens": ev.max_new_tokens, "greedy": True, "benchmark": main["benchmark"],
                          "ks": ks, "batch_size": 1},
        "results": results,
    }
    io.write_json(run_dir / "report.json", report)
    io.write_text(run_dir / "report.md", report_markdown(report))
    io.mark_done(run_dir, "eval", {"wall_s": stage_times["eval"], "acceptance_length": report["acceptance_length"]})
    return report


def report_markdown(r: dict) -> str:
    lines = [
        "# eyas evaluation report", "",
        f"- target: `{r['target']}`  (device {r['device']}, greedy, max_new_tokens "
        f"{r['eval_settings']['max_new_tokens']}, batch 1)",
        f"- acceptance length τ = **{r['acceptance_length']:.3f}** at k = {r['k']} on {r['num_prompts']} prompts "
        f"(tokens per target forward, bonus token included)",
        f"- lossless: **{str(r['lossless']).lower()}** (speculative output == plain greedy output, token for token)",
        f"- tokens/s: {r['tokens_per_second']['speculative']:.1f} speculative vs "
        f"{r['tokens_per_second']['baseline']:.1f} plain greedy ({r['speedup']:.2f}x)",
        f"- target mean next-token entropy on its outputs: {r['target_entropy']:.3f} nats", "",
        "| draft | benchmark | k | τ | per-position acceptance | lossless | prompts | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in r["results"]:
        pp = ", ".join(f"{a:.2f}" for a in x["per_position_acceptance"])
        lines.append(f"| {x['draft']} | {x['benchmark']} | {x['k']} | {x['acceptance_length']:.3f} | {pp} | "
                     f"{str(x['lossless']).lower()} | {x['num_prompts']} | {x['tokens_per_second']:.1f} |")
    lines += ["", "| stage | wall time (s) |", "|---|---|"]
    lines += [f"| {s} | {t} |" for s, t in r["stage_times"].items()]
    return "\n".join(lines) + "\n"
