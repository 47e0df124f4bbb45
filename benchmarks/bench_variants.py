"""The three gpt-oss draft variants (short-context, long-context, throughput) at demo scale: tau on short
and on long held-out prompts.

    python benchmarks/bench_variants.py [--out runs/bench-variants] [--ks 1 2 3]

Each variant is the demo recipe (recipes/demo.yaml, the built-in tiny gpt-oss target) with the
override set below, which mirrors where recipes/gpt-oss-120b-{short-context,long-context,throughput}.yaml
differ from each other:

    short-context  the demo as it is: single-question prompts (sequences of ~100-250 tokens),
                   TTT 7, rows of up to 2048 tokens
    long-context   the demo prompts plus LONG_TRAIN long prompts (below), packed rows of 1024 tokens,
                   4 rows per micro-batch (about the tokens of the demo's 16 short rows), TTT 7, the
                   O(T) TTT attention (`auto`: sdpa on CPU)
    throughput     the demo prompts, TTT 3, a draft MLP of 256 instead of 512

Long prompts are built from the demo corpus (eyas/demo_target/corpus.py): a user turn holding a
document of NOTES question-and-answer lines from the corpus ("Notes: ... Q: ... A: ...") followed by a
new question: about 800-870 tokens with the chat template (the demo target reads up to 2048
positions; data.max_prompt_tokens is 1024). The long evaluation
prompts use another seed than the long training prompts. Every variant is evaluated greedily on
the demo's 32 held-out short prompts and on 32 held-out long prompts, at each k of --ks.
Prints one row per variant: draft parameters, train time, tau per prompt set and k.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from eyas import io, layout
from eyas.demo_target.corpus import generate_samples
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

LONG_TRAIN, LONG_EVAL, NOTES = 100, 32, 36
VARIANTS = {
    "short-context": [],
    "long-context": ["train.pack=true", "train.max_length=1024", "train.batch_size=4"],
    "throughput": ["train.ttt_steps=3", "draft.intermediate_size=256", "eval.k=2"],
}


def long_prompts(n: int, seed: int) -> list[dict]:
    """n long single-turn prompts: NOTES corpus question/answer lines, then a new question."""
    samples = generate_samples(n * (NOTES + 1), seed)
    out = []
    for i in range(n):
        notes, question = (
            samples[i * (NOTES + 1) : (i + 1) * (NOTES + 1) - 1],
            samples[(i + 1) * (NOTES + 1) - 1],
        )
        doc = "\n".join(f"Q: {s.question} A: {s.final}" for s in notes)
        out.append(
            {"messages": [{"role": "user", "content": f"Notes:\n{doc}\nQuestion: {question.question}"}]}
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench-variants")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from eyas.demo_target.build import ensure_demo_target
    from eyas.eval.evaluate import run_eval

    target = Path(ensure_demo_target())
    # the short held-out prompts: the demo's own split (short-context and throughput hold out the same)
    first = out / "short-context"
    run_all(load_recipe("recipes/demo.yaml", VARIANTS["short-context"]), first, stages=("prompts",))
    short_eval = out / "short-eval.jsonl"
    held = io.read_jsonl(first / "prompts" / "eval.jsonl")
    io.write_jsonl(short_eval, ({"messages": r["messages"]} for r in held))
    long_eval = out / "long-eval.jsonl"
    io.write_jsonl(long_eval, long_prompts(LONG_EVAL, seed=2027))
    # long-context trains on the demo prompts (less the short held-out ones) and the long ones
    held_text = {json.dumps(r["messages"]) for r in held}
    mixed = out / "long-context-prompts.jsonl"
    io.write_jsonl(
        mixed,
        [r for r in io.read_jsonl(target / "prompts.jsonl") if json.dumps(r["messages"]) not in held_text]
        + long_prompts(LONG_TRAIN, seed=2026),
    )

    rows = []
    for name in args.variants:
        over = list(VARIANTS[name]) + ([f"data.prompts={mixed}"] if name == "long-context" else [])
        recipe = load_recipe("recipes/demo.yaml", over)
        run = out / name
        t0 = time.perf_counter()
        run_all(recipe, run, stages=("prompts", "regenerate", "capture", "vocab", "train"))
        train, cap = layout.read_done(run, "train"), layout.read_done(run, "capture")
        ks = [k for k in args.ks if k <= recipe.train.ttt_steps]
        report = run_eval(
            recipe,
            run,
            ks=ks,
            temperatures=[0.0],
            concurrency=[1],
            force=True,
            progress=False,
            benchmarks=[("short", str(short_eval)), ("long", str(long_eval))],
        )
        taus = {
            (r["benchmark"], r["k"]): r["acceptance_length"] for r in report["results"] if r["k"] is not None
        }
        rows.append(
            {
                "variant": name,
                "params": train["trainable_parameters"],
                "train_s": train["wall_s"],
                "tokens": cap["num_tokens"],
                "ttt_steps": recipe.train.ttt_steps,
                "tau": {f"{b}@k{k}": t for (b, k), t in sorted(taus.items())},
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    print(
        f"\n{'variant':<14} {'params':>9} {'TTT':>4} {'train s':>8} {'tokens':>8} "
        + " ".join(f"{b + ' k=' + str(k):>10}" for b in ("short", "long") for k in args.ks)
    )
    for r in rows:
        cells = [r["tau"].get(f"{b}@k{k}") for b in ("short", "long") for k in args.ks]
        print(
            f"{r['variant']:<14} {r['params']:>9,d} {r['ttt_steps']:>4} {r['train_s']:>8.0f} "
            f"{r['tokens']:>8,d} " + " ".join(f"{c:>10.3f}" if c is not None else f"{'-':>10}" for c in cells)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
