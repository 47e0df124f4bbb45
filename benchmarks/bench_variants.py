"""The three gpt-oss draft variants (short-context, long-context, throughput) on a smaller target: tau on
short and on long held-out prompts, each variant trained with one or more seeds.

    python benchmarks/bench_variants.py [--recipe recipes/demo.yaml] [--out runs/bench-variants]
        [--seeds 0] [--ks 1 2 3] [--base RUN] [--long-train FILE --long-eval FILE] [-- key.sub=value ...]

Each variant is the recipe with the override set of VARIANTS[recipe.name] (below), which mirrors where
recipes/gpt-oss-120b-{short-context,long-context,throughput}.yaml differ from each other:

    short-context  the recipe as it is
    long-context   the recipe's training conversations plus LONG_TRAIN long prompts (below), in rows long
                   enough to hold them whole, with the O(T) TTT attention (`auto`: sdpa on CPU)
    throughput     TTT 3 (served at k = 1-2; the demo's also halves the draft MLP)

A long prompt is one user turn: a document of NOTES question-and-answer lines ("Notes: Q: ... A: ...")
followed by a new question. On the demo target they come from its corpus (data/demo_target/corpus.py,
~850 tokens); on a real target from a question/answer jsonl in GSM8K's layout ({"question", "answer"}):
--long-train for training, --long-eval for the held-out ones (GSM8K test: no question or note of them is
trained on), with 16 notes ~2,650 tokens on SmolLM2's tokenizer. The long evaluation prompts use another
seed than the long training prompts.

Every variant and seed trains in OUT/<variant>-s<S> (train.seed=S; train.val_seed=0, the same held-out
sequences for all). short-context and throughput train on the same capture: --base RUN (a finished run
of the recipe) or else short-context-s0's, whose stages the others link. Every draft is evaluated greedily
in one loop per prompt set: the short held-out prompts (the recipe's eval.benchmarks, eval.num_prompts
each; the demo: its 32 held-out prompts) and, with --long-loop, the long held-out prompts (LONG's count for
the recipe), at each k of --ks; the long held-out prompts' captured answers score every draft as training
validates (simulated tau), always.
Prints one JSON line per draft (appended to OUT/results.jsonl), then the table: per variant, draft
parameters, TTT, train time, and tau per prompt set and k, mean over seeds (each seed).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

from eyas.infra import io, layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_anchors import eval_dtype_overrides, pooled  # noqa: E402
from bench_defaults import BASE_STAGES, link_stages  # noqa: E402

VARIANTS = {  # recipe name -> variant -> overrides
    "demo": {
        "short-context": [],
        # 4 rows of 1024 per micro-batch: about the tokens of the demo's 16 short rows
        "long-context": ["train.pack=true", "train.max_length=1024", "train.batch_size=4"],
        "throughput": ["train.ttt_steps=3", "draft.intermediate_size=256", "eval.k=2"],
    },
    # the recipe packs 1024-token rows already; long rows hold a ~2,800-token sequence whole
    "smollm2-135m": {
        "short-context": [],
        "long-context": ["train.max_length=4096", "data.max_prompt_tokens=4096"],
        "throughput": ["train.ttt_steps=3", "eval.k=1", "eval.more_k=[2]", "eval.tree=[]"],
    },
}
LONG_CAPTURED = "long (captured)"
LONG_MAX_TOKENS = 8192  # the long held-out prompts are captured and scored whole up to this length
LONG = {  # recipe name -> (long training prompts, long held-out prompts, notes per prompt)
    "demo": (100, 32, 36),
    "smollm2-135m": (32, 24, 16),
}


def demo_long_prompts(n: int, seed: int, notes: int, source: str | None = None) -> list[dict]:
    """n long single-turn prompts from the demo corpus: `notes` question/answer lines, then a new question."""
    from eyas.data.demo_target.corpus import generate_samples

    samples = generate_samples(n * (notes + 1), seed)
    pairs = [(s.question, s.final) for s in samples]
    return notes_prompts(pairs, n, notes)


def qa_long_prompts(n: int, seed: int, notes: int, source: str) -> list[dict]:
    """n long single-turn prompts from a GSM8K-layout jsonl, drawn without repeats after a shuffle with
    `seed`; the answers lose GSM8K's calculator marks (<<2*3=6>>)."""
    rows = io.read_jsonl(source)
    random.Random(seed).shuffle(rows)
    if len(rows) < n * (notes + 1):
        raise SystemExit(f"{source}: {len(rows)} records, fewer than {n} prompts x {notes + 1} need")
    pairs = [(r["question"], re.sub(r"<<[^>]*>>", "", r["answer"])) for r in rows]
    return notes_prompts(pairs, n, notes)


def notes_prompts(pairs: list[tuple[str, str]], n: int, notes: int) -> list[dict]:
    out = []
    for i in range(n):
        block = pairs[i * (notes + 1) : (i + 1) * (notes + 1)]
        doc = "\n".join(f"Q: {q} A: {a}" for q, a in block[:-1])
        out.append({"messages": [{"role": "user", "content": f"Notes:\n{doc}\nQuestion: {block[-1][0]}"}]})
    return out


def write_prompts(args, recipe, base: Path) -> tuple[Path, Path]:
    """OUT/long-eval.jsonl, and OUT/long-context-prompts.jsonl: the base run's training conversations
    (its held-out prompts left out) and the long training prompts."""
    out = Path(args.out)
    n_train, n_eval, notes = LONG[recipe.name]
    build = demo_long_prompts if args.long_train is None else qa_long_prompts
    long_eval = out / "long-eval.jsonl"
    io.write_jsonl(long_eval, build(n_eval, 2027, notes, args.long_eval))
    mixed = out / "long-context-prompts.jsonl"
    short = [{"messages": r["messages"]} for r in io.read_jsonl(base / "prompts" / "train.jsonl")]
    io.write_jsonl(mixed, short + build(n_train, 2026, notes, args.long_train))
    return mixed, long_eval


def train_variant(args, name: str, seed: int, base: Path, mixed: Path) -> dict:
    """OUT/<name>-s<seed> trained on `base`'s linked stages, or (long-context) on its own data, prepared by
    its first seed's run."""
    over = [*args.overrides, *VARIANTS[args.recipe_name][name], f"train.seed={seed}", "train.val_seed=0"]
    run = Path(args.out) / f"{name}-s{seed}"
    if name == "long-context":  # its own data, regenerated and captured once for all seeds
        over += [f"data.prompts={mixed}", "data.num_prompts=null"]
        base = Path(args.out) / f"{name}-s{args.seeds[0]}"
    if base.resolve() != run.resolve():
        link_stages(run, base, BASE_STAGES)
    recipe = load_recipe(args.recipe, over)
    run_all(recipe, run, stages=(*BASE_STAGES, "train"), progress=False)
    done = layout.read_done(run, "train")
    return {
        "draft": run.name,
        "variant": name,
        "seed": seed,
        "params": done["trainable_parameters"],
        "ttt_steps": recipe.train.ttt_steps,
        "train_s": done.get("run_wall_s", done["wall_s"]),  # a resumed run: all its processes
        "tokens_seen": done["tokens_seen"],
        "checkpoint": str(run / layout.FINAL_CHECKPOINT),
    }


def loop_tau(args, base: Path, rows: list[dict], sets: list[tuple[str, list, int | None]]) -> dict:
    """Every draft in eyas's serving loop, greedy, k of --ks, one loop per prompt set (name, its benchmarks
    [(name, file or known name)], prompts per benchmark) -> {(draft, set, k): tau over the set's prompts}."""
    from eyas.eval.evaluate import run_eval

    points = {}
    drafts = [(r["draft"], r["checkpoint"]) for r in rows]
    ks = [k for k in args.ks if k <= min(r["ttt_steps"] for r in rows)]
    for name, benchmarks, limit in sets:
        run = Path(args.out) / f"eval-{name}"
        report = earlier_report(run, drafts, ks)
        if report is None:
            link_stages(run, base, BASE_STAGES)
            over = [f"eval.num_prompts={'null' if limit is None else limit}", *args.eval_overrides]
            report = run_eval(
                load_recipe(args.recipe, [*args.overrides, *over]),
                run,
                drafts=drafts,
                ks=ks,
                trees=[],
                temperatures=[0.0],
                concurrency=[args.concurrency],
                benchmarks=benchmarks,
                progress=True,
                force=True,
            )
        for r in report["results"]:
            if r.get("k") is not None:
                points.setdefault((r["draft"], name, r["k"]), []).append(r)
    return {key: pooled(rs) for key, rs in points.items()}


def earlier_report(run: Path, drafts: list[tuple[str, str]], ks: list[int]) -> dict | None:
    """The report of an earlier loop in `run` when it measured every (draft, k) asked (a rerun after a later
    stage failed redoes nothing), else None."""
    path = run / layout.REPORT_JSON
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    have = {(r["draft"], r["k"]) for r in report["results"] if r.get("k") is not None}
    return report if all((name, k) in have for name, _ in drafts for k in ks) else None


def long_captured(args, rows: list[dict], long_eval: Path) -> dict:
    """The long held-out prompts' answers regenerated and captured once (OUT/long-eval-capture), and every
    draft scored over all of them as training validates (simulated tau of greedy chains, no loop noise; a
    long prompt costs the loop a prefill per draft and k) -> {(draft, "long (captured)", k): tau}."""
    from eyas.data.shards import ShardDataset
    from eyas.eval.replay import score_drafts

    run = Path(args.out) / "long-eval-capture"
    over = [f"data.prompts={long_eval}", "data.num_prompts=null", "data.num_eval_prompts=0"]
    recipe = load_recipe(args.recipe, [*args.overrides, *over, f"data.max_prompt_tokens={LONG_MAX_TOKENS}"])
    run_all(recipe, run, stages=BASE_STAGES[:3], progress=False)
    seqs = ShardDataset(run / "capture")
    drafts = [(r["draft"], r["checkpoint"]) for r in rows]
    scored = score_drafts(
        recipe, seqs, list(range(len(seqs))), drafts, [r["ttt_steps"] for r in rows], LONG_MAX_TOKENS
    )
    return {
        (name, LONG_CAPTURED, k): t
        for name, m in scored
        for k, t in enumerate(m["simulated_tau"], 1)
        if k in args.ks
    }


def short_set(args, recipe, base: Path) -> tuple[str, list, int | None]:
    """The short held-out prompts: the recipe's eval.benchmarks, else the base run's held-out prompts."""
    if recipe.eval.benchmarks:
        return ("short", list(recipe.eval.benchmarks.items()), recipe.eval.num_prompts)
    held = Path(args.out) / "short-eval.jsonl"
    io.write_jsonl(
        held, ({"messages": r["messages"]} for r in io.read_jsonl(base / "prompts" / "eval.jsonl"))
    )
    return ("short", [("short", str(held))], None)


def table(rows: list[dict], taus: dict, sets: list[str], ks: list[int]) -> list[str]:
    cols = [(s, k) for s in sets for k in ks]
    head = f"{'variant':<14} {'params':>10} {'TTT':>4} {'train s':>8} "
    lines = ["", head + " ".join(f"{f'{s} k={k}':<22}" for s, k in cols)]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        cells = []
        for s, k in cols:
            each = [taus.get((r["draft"], s, k)) for r in mine]
            text = (
                "-" if None in each else f"{sum(each) / len(each):.3f} ({'/'.join(f'{t:.2f}' for t in each)})"
            )
            cells.append(f"{text:<22}")
        train_s = sum(r["train_s"] for r in mine) / len(mine)
        lines.append(
            f"{variant:<14} {mine[0]['params']:>10,d} {mine[0]['ttt_steps']:>4} {train_s:>8.0f} "
            + " ".join(cells)
        )
    return lines


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/demo.yaml")
    p.add_argument("--out", default="runs/bench-variants")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--variants", nargs="+", default=["short-context", "long-context", "throughput"])
    p.add_argument("--base", type=Path, default=None, help="a finished run of the recipe (its stages linked)")
    p.add_argument("--long-train", default=None, help="GSM8K-layout jsonl: the long training prompts' notes")
    p.add_argument("--long-eval", default=None, help="GSM8K-layout jsonl: the long held-out prompts' notes")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--long-loop", action="store_true", help="also the long prompts in the serving loop")
    p.add_argument("--eval-dtype", default=None, help="the loop's target dtype (default the recipe's)")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value) for every variant")
    args = p.parse_args(argv)
    if (args.long_train is None) != (args.long_eval is None):
        p.error("--long-train and --long-eval go together")
    args.eval_overrides = eval_dtype_overrides(args.eval_dtype) if args.eval_dtype else []
    return args


def main(argv=None) -> int:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(args.recipe, args.overrides)
    args.recipe_name = recipe.name
    if recipe.name not in VARIANTS:
        raise SystemExit(
            f"{args.recipe}: no variant overrides for recipe {recipe.name!r} (known: {list(VARIANTS)})"
        )
    base = args.base or out / f"short-context-s{args.seeds[0]}"
    if args.base is None:
        run_all(recipe, base, stages=BASE_STAGES, progress=False)
    elif not all(layout.is_done(base, stage) for stage in BASE_STAGES):
        raise SystemExit(
            f"--base {base}: not a finished run of the recipe (its {', '.join(BASE_STAGES)} stages)"
        )
    mixed, long_eval = write_prompts(args, recipe, base)
    rows = []
    with open(out / "results.jsonl", "a") as log:
        for name in args.variants:
            for seed in args.seeds:
                rows.append(train_variant(args, name, seed, base, mixed))
                print(json.dumps(rows[-1]), file=log, flush=True)
                print(json.dumps(rows[-1]), flush=True)
        sets = [short_set(args, recipe, base)] + (
            [("long", [("long", str(long_eval))], None)] if args.long_loop else []
        )
        taus = {**loop_tau(args, base, rows, sets), **long_captured(args, rows, long_eval)}
        for (draft, s, k), tau in taus.items():
            print(json.dumps({"draft": draft, "set": s, "k": k, "tau": tau}), file=log, flush=True)
    print("\n".join(table(rows, taus, [s for s, _, _ in sets] + [LONG_CAPTURED], args.ks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
