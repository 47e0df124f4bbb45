"""`eyas eval`: acceptance and speed of drafts in the built-in serving loop, at the operating points
people serve at, next to the same requests without speculation (and, with `--server`, next to a
production engine serving the exported draft).

For every benchmark x temperature x concurrency x draft x shape (chain k or tree S,K,N):
    - the continuous-batching engine (serve/decoding) answers every prompt holding `concurrency`
      requests in flight (eval/load.py), and measures tau, per-position acceptance, output tokens/s,
      TTFT / ITL / TPOT percentiles;
    - the same engine without a draft, at the same concurrency and temperature: the baseline;
    - at temperature 0 every output is checked token for token against the target's plain greedy
      output (Hugging Face `generate`; eval.check_lossless: false skips the references and the check,
      and the report says so). In fp32 any parting is a failure: `lossless` only where every output is
      the reference. In bf16 / fp16 the target is computed again at a parting the loop's way and plain
      decoding's (eval/verdict.py): `lossless` unless a parting is a failure (the target, computed the
      loop's way, would not emit the loop's token); partings where the target's own computations
      disagree are counted as numerical, with their gaps.
Then a cost model fitted to every iteration predicts each k / tree at each concurrency and
recommends one (eval/advice.py). Writes RUN/report.json, RUN/report.md and the PNG plots.

    run_eval            the stage: settings, target and drafts, the sweep, the report
    resolve_settings    drafts, k / trees, concurrency, temperatures: the arguments, else the recipe's
    measure             the sweep: per benchmark its rendered prompts (render_prompts) and greedy
                        references, then measure_point at each temperature x concurrency
    build_report        report.json's dict; write_report: report.json, report.md, the DONE marker
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eyas.data import chat
from eyas.data.splits import SPLITS
from eyas.data.target import compute_dtype, describe_placement, input_device, load_recipe_target
from eyas.eval import advice
from eyas.eval.benchmarks import Benchmark, held_out, load_benchmark, tuning
from eyas.eval.load import (
    LoadResult,
    acceptance,
    by_length,
    draft_time_by_prompt,
    pct,
    round_times,
    run_engine,
)
from eyas.eval.report import report_markdown
from eyas.eval.verdict import verdict
from eyas.infra import io, layout
from eyas.infra.errors import InputError
from eyas.infra.stages import STAGE_ORDER
from eyas.recipes.defaults import PREFILL_TOKENS
from eyas.recipes.schema import Recipe
from eyas.recipes.types import TreeShape
from eyas.serve.decoding.engine import Engine, Request, shapes_for
from eyas.serve.decoding.reference import greedy_generate
from eyas.serve.decoding.sampling import SamplingParams
from eyas.train.blocked_attention import block_bytes
from eyas.train.checkpoint import load_draft_beside, read_config
from eyas.train.kinds import refuse_untrained
from eyas.train.model import Eagle3Draft


@dataclass
class Settings:
    """What one eval measures: the arguments where given, else the recipe's `eval` section."""

    drafts: list[tuple[str, str]]  # (name, checkpoint dir)
    ks: list[int]  # chain lengths asked for
    shapes: list[TreeShape]  # the chains of `ks`, then the trees
    concurrency: list[int]  # ascending
    temperatures: list[float]
    servers: list[tuple[str, str]]  # (name, URL) of OpenAI-compatible servers
    prefill_tokens: int = PREFILL_TOKENS  # per target forward (eval.prefill_tokens)


@dataclass
class Point:
    """One operating point of the sweep: a benchmark's rendered prompts at a temperature and a
    concurrency level. refs: the target's greedy outputs (temperature 0 in the sweep), else None."""

    bench: Benchmark
    prompts: list[list[int]]
    params: list[SamplingParams]  # per prompt
    refs: list[list[int]] | None
    temperature: float
    concurrency: int

    def label(self, what: str) -> str:
        return f"{self.bench.name} T={self.temperature:g} C={self.concurrency} {what}"


@dataclass
class Sweep:
    """What the sweep gathers: report rows, every run's engine steps (the cost model), the target's
    mean entropy along each greedy reference, plain decoding's context lengths, the effort mix."""

    results: list[dict] = field(default_factory=list)
    cost_runs: list[dict] = field(default_factory=list)  # {"shape": TreeShape | None, "steps": [StepStats]}
    entropies: list[float] = field(default_factory=list)
    contexts: list[int] = field(default_factory=list)
    efforts: Counter = field(default_factory=Counter)  # reasoning effort -> prompts rendered with it


def latency_fields(res: LoadResult, prefix: str = "") -> dict:
    return {
        f"{prefix}ttft_ms_p50": pct(res.ttft_s, 50),
        f"{prefix}ttft_ms_p95": pct(res.ttft_s, 95),
        f"{prefix}itl_ms_p50": pct(res.itl_s, 50),
        f"{prefix}itl_ms_p95": pct(res.itl_s, 95),
        f"{prefix}tpot_ms_p50": pct(res.tpot_s, 50),
    }


def result_entry(
    name: str,
    bench: Benchmark,
    engine: str,
    concurrency: int,
    temperature: float,
    shape: TreeShape | None,
    res: LoadResult,
    base: LoadResult | None,
    refs: list[list[int]] | None,
    depth: int | None = None,
    acc: dict | None = None,
    lengths: list[int] | None = None,
) -> dict:
    """One row of report.json `results`. `acc`: acceptance read from an external server's counters;
    `lengths`: each prompt's tokens (eyas's loop: the row's τ by prompt length, `by_length`)."""
    depth = depth if depth is not None else (shape.steps if shape else 0)
    if acc is None:
        acc = (
            acceptance(res.emitted, res.accepted, depth)
            if res.emitted is not None
            else {
                "acceptance_length": None,
                "tokens_per_forward": None,
                "per_position_acceptance": [],
                "target_forwards": None,
                "cut_verifications": None,
                "cut_drafts": None,
                "num_prompts": len(res.outputs),
            }
        )
    entry = {
        "draft": name,
        "benchmark": bench.name,
        "engine": engine,
        "concurrency": concurrency,
        "temperature": temperature,
        "k": (shape.steps if shape.is_chain else None) if shape else depth or None,
        "tree": shape.to_json() if shape else None,
        **acc,
        "output_tokens_per_s": res.tokens_per_s,
        "baseline_output_tokens_per_s": base.tokens_per_s if base else None,
        "speedup": res.tokens_per_s / base.tokens_per_s if base else None,
        **latency_fields(res),
        **(latency_fields(base, "baseline_") if base else {}),
        "lossless": None,
        "num_mismatched": None,
        "generated_tokens": res.generated,
        "wall_s": res.wall_s,
        "tokens_per_second": {
            "speculative": res.tokens_per_s,
            "baseline": base.tokens_per_s if base else None,
        },
    }
    if temperature == 0 and refs is not None:
        mismatched = sum(o != r for o, r in zip(res.outputs, refs))
        entry["lossless"], entry["num_mismatched"] = mismatched == 0, mismatched
    if res.emitted is not None and any(bench.categories):
        entry["by_category"] = {
            c: acceptance(res.emitted, res.accepted, depth, [x == c for x in bench.categories])
            for c in sorted({c for c in bench.categories if c})
        }
    if engine == "eyas" and shape is not None:
        entry.update(round_times(res.steps))  # draft ms per round: a chain's k forwards, P-EAGLE's one
    if res.emitted is not None and lengths:
        rounds = draft_time_by_prompt(res.steps) if concurrency == 1 else None
        entry["by_length"] = by_length(res.emitted, res.accepted, depth, lengths, rounds)
    return entry


def run_eval(
    recipe: Recipe,
    run_dir: str | Path,
    drafts: list[tuple[str, str]] | None = None,
    ks: list[int] | None = None,
    trees: list[str] | None = None,
    concurrency: list[int] | None = None,
    temperatures: list[float] | None = None,
    benchmarks: list[tuple[str, str]] | None = None,
    servers: list[tuple[str, str]] | None = None,
    progress: bool = True,
    force: bool = False,
    split: str = "test",
) -> dict:
    """drafts: (name, checkpoint dir), default the run's own; ks / trees ("S,K,N"): default the
    recipe's eval.k (+ eval.more_k) and eval.tree; concurrency / temperatures: default the recipe's;
    benchmarks: (name, prompt file or known name), default the recipe's eval prompts; servers: (name,
    URL) of OpenAI-compatible servers to drive with the same prompts (eval/server_client.py); split
    (data/splits.py): "test", those prompts, or "tuning", the held-out training conversations' first
    prompts, where settings may be chosen."""
    run_dir = Path(run_dir)
    asked = (
        drafts,
        ks,
        trees,
        concurrency,
        temperatures,
        benchmarks,
        servers,
        None if split == "test" else split,
    )
    if layout.is_done(run_dir, "eval") and not force and all(a is None for a in asked):
        return json.loads((run_dir / layout.REPORT_JSON).read_text())
    t0 = time.perf_counter()
    settings = resolve_settings(recipe, run_dir, drafts, ks, trees, concurrency, temperatures, servers)
    fix = "place it over more GPUs (target.device_map: auto); eyas's loop runs the target in transformers"
    model, tok = load_recipe_target(eval_target(recipe), fix=fix)
    loaded = load_drafts(settings.drafts, model)
    benches = resolve_benchmarks(recipe, run_dir, benchmarks, split)
    with block_bytes(recipe.eval.attention_block_mb << 20):  # the loop's, the references' and the verdict's
        sweep = measure(recipe, model, tok, loaded, benches, settings, progress)
    plain_t1 = recipe.eval.top_p == 1.0 and recipe.eval.top_k <= 0
    greedy_text = float(recipe.data.temperature) == 0.0
    validation = attach_simulated_tau(sweep.results, run_dir, settings.drafts, plain_t1, greedy_text)
    plots = _plots(sweep.results, run_dir, [b.name for b in benches])
    report = build_report(
        recipe,
        run_dir,
        model,
        settings,
        benches,
        sweep,
        validation,
        plots,
        wall_s=round(time.perf_counter() - t0, 2),
    )
    write_report(run_dir, report, plots)
    return report


def eval_target(recipe: Recipe):
    """The recipe's target section as the loop loads it: its dtype is eval.target_dtype where set."""
    dtype = recipe.eval.target_dtype
    return recipe.target if dtype is None else recipe.target.model_copy(update={"dtype": dtype})


def resolve_settings(
    recipe: Recipe,
    run_dir: Path,
    drafts: list[tuple[str, str]] | None,
    ks: list[int] | None,
    trees: list[str] | None,
    concurrency: list[int] | None,
    temperatures: list[float] | None,
    servers: list[tuple[str, str]] | None,
) -> Settings:
    """The arguments of run_eval, each defaulting to the recipe's eval section (k / trees only when
    neither is given) and the run's own draft."""
    ev = recipe.eval
    if ks is None and trees is None:
        ks, trees = list(dict.fromkeys([ev.k, *ev.more_k])), list(ev.tree)
    settings = Settings(
        drafts=drafts or [("eyas", str(layout.run_checkpoint(run_dir)))],
        ks=ks or [],
        shapes=[TreeShape.chain(k) for k in (ks or [])] + [TreeShape.parse(t) for t in (trees or [])],
        concurrency=sorted(set(concurrency or ev.concurrency)),
        temperatures=list(dict.fromkeys(temperatures if temperatures is not None else ev.temperature)),
        servers=servers or [],
        prefill_tokens=ev.prefill_tokens,
    )
    refuse_untrained_shapes(settings)
    return settings


def refuse_untrained_shapes(settings: Settings) -> None:
    """Before the target loads: every chain asked of each draft must be a round it trained where its kind
    serves only those (DraftKind.untrained_k: a P-EAGLE draft's depths, a DFlash draft's block)."""
    for name, path in settings.drafts:
        cfg = read_config(path)
        for shape in settings.shapes:
            if shape.is_chain:
                refuse_untrained(cfg, shape.steps, f"eval --draft {name} ({path})")


def load_drafts(drafts: list[tuple[str, str]], model: torch.nn.Module) -> list[tuple[str, Eagle3Draft]]:
    """Each (name, checkpoint dir) loaded beside the target (train/checkpoint.py load_draft_beside: where its
    input ids go, in its dtype, its embedding shared)."""
    return [(name, load_draft_beside(path, model)) for name, path in drafts]


def resolve_benchmarks(
    recipe: Recipe, run_dir: Path, benchmarks: list[tuple[str, str]] | None, split: str = "test"
) -> list[Benchmark]:
    """The test split: the named prompt sets (the arguments, else eval.benchmarks), each cut to
    eval.num_prompts, default the run's held-out prompts; or the tuning split's prompts (data/splits.py)."""
    ev = recipe.eval
    if split not in SPLITS[1:]:
        raise InputError(f"eval split {split!r}: expected tuning or test (the train split is trained on)")
    if split == "tuning":
        if benchmarks:
            raise InputError("eval: --prompts name the test split's sets; --split tuning takes the run's own")
        return [tuning(recipe, run_dir, ev.num_prompts)]
    benchmarks = benchmarks or list(ev.benchmarks.items())
    if not benchmarks:
        return [held_out(run_dir, ev.num_prompts)]
    return [load_benchmark(name, src, recipe.data.system_prompt, ev.num_prompts) for name, src in benchmarks]


def measure(
    recipe: Recipe,
    model: torch.nn.Module,
    tok,
    loaded: list[tuple[str, Eagle3Draft]],
    benches: list[Benchmark],
    settings: Settings,
    progress: bool,
) -> Sweep:
    """Every benchmark x temperature x concurrency (measure_point), after one warm-up request per
    engine kind; the greedy references once per benchmark when temperature 0 is swept."""
    ev = recipe.eval
    eos = set(chat.eos_token_ids(model, tok))
    runs_per_point = 1 + sum(len(shapes_for(d, settings.shapes)) for _, d in loaded) + len(settings.servers)
    total = (
        sum(len(b.messages) for b in benches)
        * len(settings.temperatures)
        * len(settings.concurrency)
        * runs_per_point
    )
    bar = tqdm(total=total, desc="eval", unit="req", disable=not progress)
    sweep = Sweep()
    _warm_up(model, loaded, settings.shapes, eos)
    for bench in benches:
        prompts = render_prompts(recipe, tok, bench, sweep.efforts)
        refs = None
        if 0.0 in settings.temperatures and ev.check_lossless:
            refs, entropies = greedy_references(model, prompts, ev.max_new_tokens, eos, ev.prefill_tokens)
            sweep.entropies += entropies
        for temp in settings.temperatures:
            params = [
                SamplingParams(
                    temperature=temp,
                    top_p=ev.top_p,
                    top_k=ev.top_k,
                    seed=ev.seed + i,
                    max_tokens=ev.max_new_tokens,
                )
                for i in range(len(prompts))
            ]
            for c in settings.concurrency:
                point = Point(bench, prompts, params, refs, temp, c)
                measure_point(model, eos, loaded, settings, point, bar, sweep)
    bar.close()
    return sweep


def render_prompts(recipe: Recipe, tok, bench: Benchmark, efforts: Counter) -> list[list[int]]:
    """Each prompt rendered with the target's chat template. gpt-oss as served: each prompt's reasoning
    effort drawn from data.reasoning_effort, as in regeneration (counted into `efforts`)."""
    d = recipe.data
    drawn = [
        chat.reasoning_effort(d.reasoning_effort, d.seed, f"eval:{bench.name}:{i}")
        for i in range(len(bench.messages))
    ]
    efforts.update(e for e in drawn if e is not None)
    return [chat.render_prompt(tok, m, **chat.effort_kwargs(e)) for m, e in zip(bench.messages, drawn)]


def greedy_references(
    model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, eos: set[int], chunk: int
) -> tuple[list[list[int]], list[float]]:
    """-> (the target's plain greedy output per prompt: the lossless check's reference, its mean
    next-token entropy along each); prompts prefilled in chunks of `chunk` tokens."""
    refs, entropies = [], []
    for p in prompts:
        ref, ent, _ = greedy_generate(model, p, max_new_tokens, eos, chunk)
        refs.append(ref)
        entropies.append(ent)
    return refs, entropies


def measure_point(
    model: torch.nn.Module,
    eos: set[int],
    loaded: list[tuple[str, Eagle3Draft]],
    settings: Settings,
    point: Point,
    bar: tqdm,
    sweep: Sweep,
) -> None:
    """Plain decoding (the baseline), then each draft at each shape, then each server, at one point."""
    c, temp, bench = point.concurrency, point.temperature, point.bench
    bar.set_postfix_str(point.label("plain"))
    chunk = settings.prefill_tokens
    plain = Engine(model, max_batch=c, eos_ids=eos, profile=True, prefill_tokens=chunk)
    base = run_engine(plain, point.prompts, point.params, c, bar)
    sweep.cost_runs.append({"shape": None, "steps": base.steps})
    sweep.contexts += [s.context for s in base.steps if s.kind == "decode"]
    for name, draft in loaded:
        for shape in shapes_for(draft, settings.shapes):  # a P-EAGLE draft proposes chains only
            bar.set_postfix_str(point.label(f"{name} {shape.label}"))
            eng = Engine(model, draft, shape, max_batch=c, eos_ids=eos, profile=True, prefill_tokens=chunk)
            res = run_engine(eng, point.prompts, point.params, c, bar)
            eng.close()
            lengths = [len(p) for p in point.prompts]
            entry = result_entry(name, bench, "eyas", c, temp, shape, res, base, point.refs, lengths=lengths)
            entry["draft_kind"] = draft.config.kind  # eval/advice.py: the draft forwards of a round
            entry["trained_k"] = draft.config.trained_k  # and the chains it may advise (only trained ones)
            if entry["num_mismatched"]:  # where they part: numerics of the target's shapes, or a failure
                entry.update(classified(model, point, res, shape.num_draft_tokens, chunk))
            sweep.results.append(entry)
            sweep.cost_runs.append({"shape": shape, "kind": draft.config.kind, "steps": res.steps})
    for name, url in settings.servers:
        from eyas.eval.server_client import run_server  # lazy: httpx

        bar.set_postfix_str(point.label(f"server {name}"))
        res, engine_name, depth, acc, per_length = run_server(url, point.prompts, point.params, c, bar)
        entry = result_entry(name, bench, engine_name, c, temp, None, res, None, point.refs, depth, acc)
        if per_length:
            entry["by_length"] = per_length
        sweep.results.append(entry)


def classified(model: torch.nn.Module, point: Point, res: LoadResult, width: int, chunk: int) -> dict:
    """A greedy row's partings from the target's greedy outputs (eval/verdict.py): lossless with no failure.
    In fp32, where the loop is exact, every parting is a failure; otherwise each is classified, the numerical
    ones counted with their gaps."""

    exact = compute_dtype(model) == torch.float32
    numerical, failures, partings = verdict(
        model, point.prompts, res.outputs, point.refs, res.emitted, width, exact, chunk
    )
    return {
        "lossless": failures == 0,
        "numerical_partings": numerical,
        "failures": failures,
        "partings": partings,
    }


def build_report(
    recipe: Recipe,
    run_dir: Path,
    model: torch.nn.Module,
    settings: Settings,
    benches: list[Benchmark],
    sweep: Sweep,
    validation: dict | None,
    plots: list[Path],
    wall_s: float,
) -> dict:
    """report.json: the headline numbers of the first eyas-engine row (else the first row), every row,
    the recommendation and the cost model behind it, the settings, each stage's wall time and the
    training's validation (attach_simulated_tau)."""
    results = sweep.results
    model_fit = advice.fit_cost_model(sweep.cost_runs)
    context = sum(sweep.contexts) / max(len(sweep.contexts), 1)
    main = next((r for r in results if r["engine"] == "eyas"), None) or results[0]
    greedy_rows = [r["lossless"] for r in results if r["lossless"] is not None]
    done = {s: layout.read_done(run_dir, s) for s in STAGE_ORDER[:-1] if layout.is_done(run_dir, s)}
    # training resumed: all its processes' time (run_wall_s), not its last one's
    stage_times = {s: d.get("run_wall_s", d.get("wall_s")) for s, d in done.items()}
    stage_times["eval"] = wall_s
    device = input_device(model)
    ev = recipe.eval
    return {
        "acceptance_length": main["acceptance_length"],
        "k": main["k"],
        "per_position_acceptance": main["per_position_acceptance"],
        "lossless": all(greedy_rows) if greedy_rows else None,
        "num_prompts": main["num_prompts"],
        "tokens_per_second": {
            "speculative": main["output_tokens_per_s"],
            "baseline": main["baseline_output_tokens_per_s"],
        },
        "speedup": main["speedup"],
        "target_entropy": sum(sweep.entropies) / len(sweep.entropies) if sweep.entropies else None,
        "stage_times": stage_times,
        "target": recipe.target.model,
        "draft": settings.drafts[0][1],
        "device": str(device)
        if recipe.target.device_map is None
        else f"{device} (target {describe_placement(model, recipe.target.device_map)})",
        "eval_settings": {
            "max_new_tokens": ev.max_new_tokens,
            "greedy": settings.temperatures == [0.0],
            "benchmark": main["benchmark"],
            "benchmarks": [b.name for b in benches],
            "ks": settings.ks,
            "trees": [s.to_json() for s in settings.shapes if not s.is_chain],
            "concurrency": settings.concurrency,
            "temperatures": settings.temperatures,
            "top_p": ev.top_p,
            "top_k": ev.top_k,
            "seed": ev.seed,
            "check_lossless": ev.check_lossless,
            "reasoning_effort_mix": dict(sorted(sweep.efforts.items())) or None,
            "servers": [{"name": n, "url": u} for n, u in settings.servers],
        },
        "results": results,
        "recommendation": advice.recommend(results, model_fit, context),
        "cost_model": {**model_fit, "mean_context": context},
        "plots": [p.name for p in plots]
        + (["train/curves.png"] if (run_dir / "train" / "curves.png").is_file() else []),
        "training_validation": validation,
    }


def write_report(run_dir: Path, report: dict, plots: list[Path]) -> None:
    """RUN/report.json, RUN/report.md, then the eval stage's DONE marker listing them and the plots."""
    io.write_json(run_dir / layout.REPORT_JSON, report)
    io.write_text(run_dir / layout.REPORT_MD, report_markdown(report))
    info = {"wall_s": report["stage_times"]["eval"], "acceptance_length": report["acceptance_length"]}
    layout.mark_done(
        run_dir, "eval", info, outside=(layout.REPORT_JSON, layout.REPORT_MD, *(p.name for p in plots))
    )


def attach_simulated_tau(
    results: list[dict],
    run_dir: Path,
    drafts: list[tuple[str, str]],
    plain_t1: bool = True,
    greedy_text: bool = True,
) -> dict | None:
    """The training's validation predicts a chain's tau for every k <= ttt_steps, greedy and at T = 1
    (train/validation.py); set it on each chain row of the run's own draft at temperature 0, or 1 when
    `plain_t1` (no top-p / top-k: the validation's full softmax), next to the measured tau, so the gap
    between training's estimate and the loop shows; greedy, where the answers are the target's greedy text
    (`greedy_text`), also the replayed tau (the loop's own rounds along it). -> the validation dict."""
    if not layout.is_done(run_dir, "train"):
        return None
    done = layout.read_done(run_dir, "train")
    best = done.get("best")  # train.keep_best: the run's draft is that validation's
    validation = best["validation"] if best else done.get("validation")
    if not validation:
        return None
    own = {name for name, path in drafts if Path(path).resolve() == layout.run_checkpoint(run_dir).resolve()}
    sims = {0.0: validation["simulated_tau"], 1.0: validation.get("simulated_tau_t1") if plain_t1 else None}
    for r in results:
        sim = sims.get(float(r["temperature"]))
        if (
            sim
            and r["draft"] in own
            and r["engine"] == "eyas"
            and r.get("tree") is None
            and r["k"]
            and r["k"] <= len(sim)
        ):
            r["training_simulated_tau"] = sim[r["k"] - 1]
            replayed = (
                validation.get("replayed_tau") if greedy_text and float(r["temperature"]) == 0 else None
            )
            if replayed and r["k"] <= len(replayed):  # greedy: the loop's own rounds along the text
                r["training_replayed_tau"] = replayed[r["k"] - 1]
    return validation


def _warm_up(
    model: torch.nn.Module, loaded: list[tuple[str, Eagle3Draft]], shapes: list[TreeShape], eos: set[int]
) -> None:
    """One short request through each engine kind, so first-call costs (kernel selection, lazy
    buffers) are not timed."""
    p = SamplingParams(temperature=0, max_tokens=4)
    Engine(model, max_batch=1, eos_ids=eos).run([Request([1, 2, 3], p)])
    for _, draft in loaded[:1]:
        for shape in shapes_for(draft, shapes):
            eng = Engine(model, draft, shape, max_batch=1, eos_ids=eos)
            eng.run([Request([1, 2, 3], p)])
            eng.close()


def _plots(results: list[dict], run_dir: Path, benches: list[str]) -> list[Path]:
    from eyas.eval.plots import acceptance_plot, throughput_plot  # lazy: matplotlib

    out = []
    for i, b in enumerate(benches):
        suffix = "" if i == 0 else f"-{''.join(c if c.isalnum() else '-' for c in b)}"
        out.append(throughput_plot(results, run_dir / f"report-throughput{suffix}.png", b))
        out.append(acceptance_plot(results, run_dir / f"report-acceptance{suffix}.png", b))
    return out
