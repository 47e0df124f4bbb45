"""The budget trend: the SmolLM2 recipe's training choices against SpecForge's (which the gpt-oss recipes
had before this trend) at 1x, 2x, 4x ... the data (more conversations, the same epochs), to see whether a
lead holds or grows with the budget.

    python benchmarks/bench_budget.py --recipe recipes/smollm2-135m.yaml --out runs/bench-budget \
        [--budgets 1 2 4] [--seeds 0 1] [--choices smollm2 specforge] [--data RUN] [key.sub=value ...]

Budget B is the recipe with data.num_prompts = B x its own; the extra conversations all come from its first
source (GSM8K train in the SmolLM2 recipe: the only one here with thousands of unique prompts; the ShareGPT
sample has 153), every other source keeps its 1x count, and each source's shuffle is the same at every
budget, so budget B's conversations hold budget B/2's. Each budget's prompts, regeneration, capture and vocab
run once in OUT/b<B>/_base (1x: linked from --data, a run of the recipe that has them), and each (choice,
seed) trains there in OUT/b<B>/<choice>-s<S> with train.val_seed=0. A choice is scored twice:
- on the tuning split, by training's validation (whole conversations held out, data/splits.py): replayed tau
  at k = 1..5, the greedy loop's own rounds along the held-out text. The choice is made here.
- on the test split (the recipe's eval prompts, nothing tuned on them), in eyas's loop at eval.k, greedy and
  T = 1, every draft not yet scored in one eval (OUT/eval; scores kept in OUT/loop.jsonl): the numbers that
  are reported.
Prints one JSON line per trained run (also appended to OUT/results.jsonl), then per budget and choice the
mean over seeds and each seed's value, and the lead of the first choice over the second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_defaults import BASE_STAGES, KS, link_stages, loop_drafts, score

from eyas.infra import layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

# Training choices only: both drafts are servable by vLLM, SGLang and TensorRT-LLM (norm_output, a vLLM-only
# option, is off in both; its gain is measured in docs/benchmarks.md#defaults-on-a-real-model).
CHOICES = {
    # recipes/smollm2-135m.yaml (and, since this trend, the gpt-oss recipes'): Muon lr 3e-3, the target's
    # lm_head rows frozen, TTT 5, packed 1024-token rows
    "smollm2": ["draft.norm_output=false"],
    # SpecForge's (the gpt-oss recipes' before this trend): AdamW 1e-4, a trained lm_head (random init),
    # TTT 7, one unpacked sequence per row and 4 rows per step (~800 tokens here, as the packed 1024-token
    # row's ~5 sequences); the rest as the SmolLM2 recipe's (decay 0.8, warmup 3%, grad clip 0.5, KL, 2
    # epochs)
    "specforge": [
        "draft.norm_output=false",
        "draft.lm_head=random",
        "train.optimizer=adamw",
        "train.lr=1e-4",
        "train.weight_decay=0.0",
        "train.ttt_steps=7",
        "train.pack=false",
        "train.batch_size=1",
        "train.grad_accum=4",
    ],
}


def budget_overrides(recipe, budget: int) -> list[str]:
    """data.num_prompts x budget, the extra prompts from the first source, the others at their 1x counts
    (1x: the recipe itself)."""
    from eyas.data.prompts import quotas

    d = recipe.data
    if budget == 1:
        return []
    counts = quotas(d.num_prompts, [s.weight for s in d.prompts])
    counts[0] += (budget - 1) * d.num_prompts
    sources = [{**s.model_dump(exclude_none=True), "weight": c} for s, c in zip(d.prompts, counts)]
    return [f"data.num_prompts={budget * d.num_prompts}", f"data.prompts={json.dumps(sources)}"]


def base_run(args, budget: int) -> tuple[Path, list[str]]:
    """OUT/b<B>/_base with the budget's data stages -> (it, the budget's overrides)."""
    over = [*args.overrides, *budget_overrides(load_recipe(args.recipe, args.overrides), budget)]
    base = Path(args.out) / f"b{budget}" / "_base"
    if budget == 1 and args.data:
        link_stages(base, Path(args.data), BASE_STAGES[:3])
    run_all(load_recipe(args.recipe, [*over, "train.val_seed=0"]), base, stages=BASE_STAGES, progress=True)
    return base, over


def train(args, base: Path, over: list[str], budget: int, choice: str, seed: int) -> dict:
    """OUT/b<B>/<choice>-s<S> trained -> its row: the tuning split's replayed tau by k, its training time."""
    run = base.parent / f"{choice}-s{seed}"
    recipe = load_recipe(args.recipe, [*over, *CHOICES[choice], f"train.seed={seed}", "train.val_seed=0"])
    link_stages(run, base, BASE_STAGES)
    run_all(recipe, run, stages=(*BASE_STAGES, "train"), progress=True)
    s = score(run)
    return {"run": str(run), "budget": budget, "choice": choice, "seed": seed, **s}


def draft_name(row: dict) -> str:
    """A trained run's name in the loop's eval: <choice>-s<S>-b<B>."""
    return f"{Path(row['run']).name}-b{row['budget']}"


def table(args, rows: list[dict], tau: dict) -> list[str]:
    """Per budget and choice: tuning replayed tau at k = 1..5 and test loop tau (greedy, T = 1) at eval.k,
    means over seeds with each seed's value; then the first choice's lead over the second per budget."""
    k = load_recipe(args.recipe, args.overrides).eval.k
    cols = [f"tuning k={j}" for j in KS] + [f"test T={t:g} k={k}" for t in (0.0, 1.0)]
    lines = [f"{'budget':<8}{'choice':<10}" + "".join(f"{c:>16}" for c in cols)]
    means: dict[tuple, list[float]] = {}
    for budget in args.budgets:
        for choice in args.choices:
            mine = [r for r in rows if r["budget"] == budget and r["choice"] == choice]
            vals = [[r["replayed_tau"].get(j) for r in mine] for j in KS]
            vals += [[tau.get((draft_name(r), t)) for r in mine] for t in (0.0, 1.0)]
            means[budget, choice] = [sum(v) / len(v) if v and None not in v else float("nan") for v in vals]
            lines.append(f"{budget:<8}{choice:<10}" + "".join(f"{m:>16.3f}" for m in means[budget, choice]))
            lines.append(" " * 18 + "".join(f"{'/'.join(f'{x:.2f}' for x in v if x):>16}" for v in vals))
    if len(args.choices) == 2:
        a, b = args.choices
        lines += ["", f"lead of {a} over {b}"]
        for budget in args.budgets:
            lead = [x - y for x, y in zip(means[budget, a], means[budget, b])]
            lines.append(f"{budget:<18}" + "".join(f"{d:>+16.3f}" for d in lead))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/smollm2-135m.yaml")
    p.add_argument("--out", default="runs/bench-budget")
    p.add_argument(
        "--data", default=None, help="a run of the recipe whose prompts, regeneration, capture to link"
    )
    p.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--choices", nargs="+", default=list(CHOICES), choices=list(CHOICES))
    p.add_argument("--no-loop", action="store_true", help="train and score on tuning only")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value) for every run")
    args = p.parse_args(argv)
    rows, bases = [], []
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / "results.jsonl", "a") as log:
        for budget in args.budgets:  # budget-major: a run cut short has whole budgets
            base, over = base_run(args, budget)
            bases.append(base)
            for seed in args.seeds:
                for choice in args.choices:
                    rows.append(train(args, base, over, budget, choice, seed))
                    print(json.dumps(rows[-1]), file=log, flush=True)
                    print(json.dumps(rows[-1]), flush=True)
    tau = {} if args.no_loop else loop(args, rows, bases[0])
    print("\n".join(table(args, rows, tau)))
    return 0


def loop(args, rows: list[dict], base: Path) -> dict:
    """Every row's draft in eyas's loop on the test split (the recipe's eval prompts, the same for every
    budget), greedy and T = 1 -> {(draft name, temperature): tau}. A draft that OUT/loop.jsonl already
    scored with the same checkpoint (file stamp) and the same eval (the recipe's eval section) is not
    evaluated again."""
    temps, log = [0.0, 1.0], Path(args.out) / "loop.jsonl"
    recipe = load_recipe(args.recipe, args.overrides)
    same_eval = json.dumps(recipe.eval.model_dump(mode="json"), sort_keys=True)
    drafts = {draft_name(r): Path(r["run"]) / layout.FINAL_CHECKPOINT for r in rows}
    stamp = {d: checkpoint_stamp(c) for d, c in drafts.items()}
    done = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    tau = {
        (x["draft"], x["temperature"]): x["tau"]
        for x in done
        if x.get("stamp") == stamp.get(x["draft"]) and x.get("eval") == same_eval
    }
    todo = [(d, str(c)) for d, c in drafts.items() if any((d, t) not in tau for t in temps)]
    if todo:
        new = loop_drafts(recipe, Path(args.out) / "eval", base, todo, temps)
        with open(log, "a") as f:
            for (d, t), v in new.items():
                row = {"draft": d, "temperature": t, "tau": v, "stamp": stamp[d], "eval": same_eval}
                print(json.dumps(row), file=f)
        tau.update(new)
    return tau


def checkpoint_stamp(checkpoint: Path) -> str:
    """The checkpoint's weights file, as '<mtime_ns>-<bytes>': a retrained draft gets a new stamp."""
    st = (checkpoint / "model.safetensors").stat()
    return f"{st.st_mtime_ns}-{st.st_size}"


if __name__ == "__main__":
    sys.exit(main())
