"""`eyas eval`: acceptance and speed of drafts in the built-in serving loop, at the operating points
people serve at, next to the same requests without speculation (and, with `--server`, next to a
production engine serving the exported draft).

For every benchmark x temperature x concurrency x draft x shape (chain k or tree S,K,N):
    - the continuous-batching engine (serve/decoding) answers every prompt holding `concurrency`
      requests in flight (eval/load.py), and measures tau, per-position acceptance, output tokens/s,
      TTFT / ITL / TPOT percentiles;
    - the same engine without a draft, at the same concurrency and temperature: the baseline;
    - at temperature 0 every output is checked token for token against the target's plain greedy
      output (Hugging Face `generate`): `lossless`.
Then a cost model fitted to every iteration predicts each k / tree at each concurrency and
recommends one (eval/advice.py). Writes RUN/report.json, RUN/report.md and the PNG plots.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eyas import io, layout
from eyas.eval import advice
from eyas.eval.benchmarks import Benchmark, held_out, load_benchmark
from eyas.eval.load import LoadResult, acceptance, pct, run_engine
from eyas.stages import STAGE_ORDER
from eyas.recipes.schema import Recipe
from eyas.serve.decoding.sampling import SamplingParams
from eyas.serve.decoding.tree import TreeShape


def latency_fields(res: LoadResult, prefix: str = "") -> dict:
    return {f"{prefix}ttft_ms_p50": pct(res.ttft_s, 50), f"{prefix}ttft_ms_p95": pct(res.ttft_s, 95),
            f"{prefix}itl_ms_p50": pct(res.itl_s, 50), f"{prefix}itl_ms_p95": pct(res.itl_s, 95),
            f"{prefix}tpot_ms_p50": pct(res.tpot_s, 50)}


def result_entry(name: str, bench: Benchmark, engine: str, concurrency: int, temperature: float,
                 shape: TreeShape | None, res: LoadResult, base: LoadResult | None,
                 refs: list[list[int]] | None, depth: int | None = None, acc: dict | None = None) -> dict:
    """One row of report.json `results`. `acc`: acceptance read from an external server's counters."""
    depth = depth if depth is not None else (shape.steps if shape else 0)
    if acc is None:
        acc = acceptance(res.emitted, res.accepted, depth) if res.emitted is not None else {
            "acceptance_length": None, "per_position_acceptance": [], "target_forwards": None,
            "cut_verifications": None, "num_prompts": len(res.outputs)}
    entry = {
        "draft": name, "benchmark": bench.name, "engine": engine, "concurrency": concurrency,
        "temperature": temperature,
        "k": (shape.steps if shape.is_chain else None) if shape else depth or None,
        "tree": shape.to_json() if shape else None,
        **acc,
        "output_tokens_per_s": res.tokens_per_s,
        "baseline_output_tokens_per_s": base.tokens_per_s if base else None,
        "speedup": res.tokens_per_s / base.tokens_per_s if base else None,
        **latency_fields(res),
        **(latency_fields(base, "baseline_") if base else {}),
        "lossless": None, "num_mismatched": None,
        "generated_tokens": res.generated, "wall_s": res.wall_s,
        "tokens_per_second": {"speculative": res.tokens_per_s, "baseline": base.tokens_per_s if base else None},
    }
    if temperature == 0 and refs is not None:
        mismatched = sum(o != r for o, r in zip(res.outputs, refs))
        entry["lossless"], entry["num_mismatched"] = mismatched == 0, mismatched
    if res.emitted is not None and any(bench.categories):
        entry["by_category"] = {c: acceptance(res.emitted, res.accepted, depth, [x == c for x in bench.categories])
                                for c in sorted({c for c in bench.categories if c})}
    return entry


def run_eval(recipe: Recipe, run_dir: str | Path, drafts: list[tuple[str, str]] | None = None,
             ks: list[int] | None = None, trees: list[str] | None = None, concurrency: list[int] | None = None,
             temperatures: list[float] | None = None, benchmarks: list[tuple[str, str]] | None = None,
             servers: list[tuple[str, str]] | None = None, progress: bool = True, force: bool = False) -> dict:
    """drafts: (name, checkpoint dir), default the run's own; ks / trees ("S,K,N"): default the
    recipe's eval.k (+ eval.more_k) and eval.tree; concurrency / temperatures: default the recipe's; benchmarks:
    (name, prompt file or known name), default the run's held-out prompts; servers: (name, URL) of
    OpenAI-compatible servers to drive with the same prompts (eval/server_client.py)."""
    from eyas.data.chat import effort_kwargs, eos_token_ids, reasoning_effort, render_prompt
    from eyas.data.target import describe_placement, input_device, load_recipe_target
    from eyas.serve.decoding.engine import Engine
    from eyas.serve.decoding.reference import greedy_generate
    from eyas.train.checkpoint import load_draft

    run_dir = Path(run_dir)
    asked = (drafts, ks, trees, concurrency, temperatures, benchmarks, servers)
    if layout.is_done(run_dir, "eval") and not force and all(a is None for a in asked):
        return json.loads((run_dir / layout.REPORT_JSON).read_text())
    t0 = time.perf_counter()
    ev = recipe.eval
    drafts = drafts or [("eyas", str(run_dir / layout.FINAL_CHECKPOINT))]
    if ks is None and trees is None:
        ks, trees = list(dict.fromkeys([ev.k, *ev.more_k])), list(ev.tree)
    shapes = [TreeShape.chain(k) for k in (ks or [])] + [TreeShape.parse(t) for t in (trees or [])]
    concurrency = sorted(set(concurrency or ev.concurrency))
    temperatures = list(dict.fromkeys(temperatures if temperatures is not None else ev.temperature))
    model, tok = load_recipe_target(recipe.target)
    eos = set(eos_token_ids(model, tok))
    dtype = next(model.parameters()).dtype
    device = input_device(model)  # the serving loop's per-row state and the draft go where the input ids go
    loaded = [(name, load_draft(path, device=device, dtype=dtype if dtype != torch.float16 else torch.float32).eval())
              for name, path in drafts]
    benches = [held_out(run_dir, ev.num_prompts)] if not benchmarks else \
        [load_benchmark(name, src, recipe.data.system_prompt, ev.num_prompts) for name, src in benchmarks]

    runs_per_point = 1 + len(loaded) * len(shapes) + len(servers or [])
    total = sum(len(b.messages) for b in benches) * len(temperatures) * len(concurrency) * runs_per_point
    bar = tqdm(total=total, desc="eval", unit="req", disable=not progress)
    results, cost_runs, entropies, contexts = [], [], [], []
    effort_counts: Counter = Counter()
    _warm_up(model, loaded, shapes, eos)
    for bench in benches:
        # gpt-oss as served: each prompt's reasoning effort drawn from data.reasoning_effort, as in regeneration
        efforts = [reasoning_effort(recipe.data.reasoning_effort, recipe.data.seed, f"eval:{bench.name}:{i}")
                   for i in range(len(bench.messages))]
        effort_counts.update(e for e in efforts if e is not None)
        prompts = [render_prompt(tok, m, **effort_kwargs(e)) for m, e in zip(bench.messages, efforts)]
        refs = None
        if 0.0 in temperatures:
            refs = []
            for p in prompts:
                ref, ent, _ = greedy_generate(model, p, ev.max_new_tokens, eos)
                refs.append(ref)
                entropies.append(ent)
        for temp in temperatures:
            params = [SamplingParams(temperature=temp, top_p=ev.top_p, top_k=ev.top_k, seed=ev.seed + i,
                                     max_tokens=ev.max_new_tokens) for i in range(len(prompts))]
            for c in concurrency:
                bar.set_postfix_str(f"{bench.name} T={temp:g} C={c} plain")
                base = run_engine(Engine(model, max_batch=c, eos_ids=eos, profile=True), prompts, params, c, bar)
                cost_runs.append({"shape": None, "steps": base.steps})
                contexts += [s.context for s in base.steps if s.kind == "decode"]
                for name, draft in loaded:
                    for shape in shapes:
                        bar.set_postfix_str(f"{bench.name} T={temp:g} C={c} {name} {shape.label}")
                        eng = Engine(model, draft, shape, max_batch=c, eos_ids=eos, profile=True)
                        res = run_engine(eng, prompts, params, c, bar)
                        eng.close()
                        results.append(result_entry(name, bench, "eyas", c, temp, shape, res, base, refs))
                        cost_runs.append({"shape": shape, "steps": res.steps})
                for name, url in servers or []:
                    from eyas.eval.server_client import run_server

                    bar.set_postfix_str(f"{bench.name} T={temp:g} C={c} server {name}")
                    res, engine_name, depth, acc = run_server(url, prompts, params, c, bar)
                    results.append(result_entry(name, bench, engine_name, c, temp, None, res, None, refs, depth, acc))
    bar.close()
    validation = attach_simulated_tau(results, run_dir, drafts)

    model_fit = advice.fit_cost_model(cost_runs)
    context = sum(contexts) / max(len(contexts), 1)
    recommendation = advice.recommend(results, model_fit, context)
    plots = _plots(results, run_dir, [b.name for b in benches])
    main = next(r for r in results if r["engine"] == "eyas") if any(r["engine"] == "eyas" for r in results) \
        else results[0]
    greedy_rows = [r["lossless"] for r in results if r["lossless"] is not None]
    stage_times = {s: layout.read_done(run_dir, s).get("wall_s") for s in STAGE_ORDER[:-1] if layout.is_done(run_dir, s)}
    stage_times["eval"] = round(time.perf_counter() - t0, 2)
    report = {
        "acceptance_length": main["acceptance_length"],
        "k": main["k"],
        "per_position_acceptance": main["per_position_acceptance"],
        "lossless": all(greedy_rows) if greedy_rows else None,
        "num_prompts": main["num_prompts"],
        "tokens_per_second": {"speculative": main["output_tokens_per_s"],
                              "baseline": main["baseline_output_tokens_per_s"]},
        "speedup": main["speedup"],
        "target_entropy": sum(entropies) / len(entropies) if entropies else None,
        "stage_times": stage_times,
        "target": recipe.target.model,
        "draft": drafts[0][1],
        "device": str(device) if recipe.target.device_map is None else
                  f"{device} (target {describe_placement(model, recipe.target.device_map)})",
        "eval_settings": {"max_new_tokens": ev.max_new_tokens, "greedy": temperatures == [0.0],
                          "benchmark": main["benchmark"], "benchmarks": [b.name for b in benches],
                          "ks": ks or [], "trees": [s.to_json() for s in shapes if not s.is_chain],
                          "concurrency": concurrency, "temperatures": temperatures, "top_p": ev.top_p,
                          "top_k": ev.top_k, "seed": ev.seed,
                          "reasoning_effort_mix": dict(sorted(effort_counts.items())) or None,
                          "servers": [{"name": n, "url": u} for n, u in servers or []]},
        "results": results,
        "recommendation": recommendation,
        "cost_model": {**model_fit, "mean_context": context},
        "plots": [p.name for p in plots] + (["train/curves.png"] if (run_dir / "train" / "curves.png").is_file() else []),
        "training_validation": validation,
    }
    from eyas.eval.report import report_markdown

    io.write_json(run_dir / layout.REPORT_JSON, report)
    io.write_text(run_dir / layout.REPORT_MD, report_markdown(report))
    layout.mark_done(run_dir, "eval", {"wall_s": stage_times["eval"], "acceptance_length": report["acceptance_length"]},
                 outside=(layout.REPORT_JSON, layout.REPORT_MD, *(p.name for p in plots)))
    return report


def attach_simulated_tau(results: list[dict], run_dir: Path, drafts: list[tuple[str, str]]) -> dict | None:
    """The training's validation predicts a greedy chain's tau for every k <= ttt_steps
    (train/validation.py); set it on each greedy chain row of the run's own draft, next to the
    measured tau, so the gap between training's estimate and the loop shows. -> the validation dict."""
    if not layout.is_done(run_dir, "train"):
        return None
    validation = layout.read_done(run_dir, "train").get("validation")
    if not validation:
        return None
    own = {name for name, path in drafts
           if Path(path).resolve() == (run_dir / layout.FINAL_CHECKPOINT).resolve()}
    sim = validation["simulated_tau"]
    for r in results:
        if r["draft"] in own and r["engine"] == "eyas" and r["temperature"] == 0 and r.get("tree") is None \
                and r["k"] and r["k"] <= len(sim):
            r["training_simulated_tau"] = sim[r["k"] - 1]
    return validation


def _warm_up(model, loaded, shapes, eos) -> None:
    """One short request through each engine kind, so first-call costs (kernel selection, lazy
    buffers) are not timed."""
    from eyas.serve.decoding.engine import Engine, Request

    p = SamplingParams(temperature=0, max_tokens=4)
    Engine(model, max_batch=1, eos_ids=eos).run([Request([1, 2, 3], p)])
    for _, draft in loaded[:1]:
        for shape in shapes:
            eng = Engine(model, draft, shape, max_batch=1, eos_ids=eos)
            eng.run([Request([1, 2, 3], p)])
            eng.close()


def _plots(results: list[dict], run_dir: Path, benches: list[str]) -> list[Path]:
    from eyas.eval.plots import acceptance_plot, throughput_plot

    out = []
    for i, b in enumerate(benches):
        suffix = "" if i == 0 else f"-{''.join(c if c.isalnum() else '-' for c in b)}"
        out.append(throughput_plot(results, run_dir / f"report-throughput{suffix}.png", b))
        out.append(acceptance_plot(results, run_dir / f"report-acceptance{suffix}.png", b))
    return out
