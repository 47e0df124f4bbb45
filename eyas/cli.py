"""The `eyas` command: one subcommand per stage, and `eyas run RECIPE` for all of them.

    eyas run RECIPE [--out DIR] [key.sub=value ...]      every stage, resuming finished ones
    eyas prompts|regenerate|capture|vocab|train RECIPE_OR_RUN [--out DIR] [overrides]
    eyas regenerate|capture RUN --shard I/N             slice I of N (one per machine; the last joins)
    eyas eval RECIPE_OR_RUN [--draft NAME=CKPT ...] [--k K ...] [--tree S,K,N ...] [--concurrency C ...]
              [--temperature T ...] [--prompts NAME=FILE ...] [--server [NAME=]URL ...]
    eyas serve RUN_OR_RECIPE [--draft DIR] [--k K | --tree S,K,N] [--host 127.0.0.1] [--port 8000]
    eyas plan RECIPE --gpus 8xH100 [--run DIR] [overrides]  memory, storage and time before anything runs
    eyas verify RUN                                      every file of a run against its size and checksum
    eyas demo-target [--cache-dir DIR] [--force]
    eyas full-width-target [--force]
    eyas recipe-keys [SECTION]                           every recipe key with its default and description
    eyas install-vllm [--venv DIR]                       vLLM (CPU build) in a venv of its own
    eyas export | import | publish ...                   see `eyas <cmd> --help`

An expected failure prints one line `eyas: error: <what, which file or key, what to do>` and exits 2 (bad
input) or 1 (a runtime failure); add --debug (or EYAS_DEBUG=1) for its traceback. SIGINT / SIGTERM keep
what is complete (training saves its state) and exit 130 / 143; re-run the same command to continue.

Training on many GPUs: `accelerate launch -m eyas.train RECIPE --out DIR [overrides]`; under
`torchrun` / `accelerate launch`, `eyas run|regenerate|capture` share regeneration and capture out by rank.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eyas.data.sharding import current_shard
from eyas.infra.errors import debugging, report_failures
from eyas.infra.interrupts import signals_raise
from eyas.infra.layout import REPORT_JSON, REPORT_MD
from eyas.infra.peak_memory import describe
from eyas.infra.stages import COMMANDS, SHARDED, STAGE_ORDER, resolve
from eyas.pipeline import (
    check_target,
    done_already,
    measured,
    prepare_run,
    record_stage_cost,
    run_all,
    run_stage,
)
from eyas.recipes.load import recipe_and_run
from eyas.recipes.schema import RecipeError
from eyas.recipes.types import TreeShape


def _recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML (or a shipped name such as 'demo'), or an existing run dir")
    p.add_argument("--out", help="run directory (default runs/<recipe name>)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=3e-4 eval.k=5")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _pairs(values, flag):
    out = []
    for v in values or []:
        if "=" not in v:
            raise RecipeError(f"{flag} {v!r}: expected NAME=PATH")
        out.append(tuple(v.split("=", 1)))
    return out


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `argv`; dotted overrides (key.sub=value) may come before or after the options."""
    args, extra = parser.parse_known_args(argv)
    stray = [e for e in extra if e.startswith("-") or "=" not in e]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = list(args.overrides) + extra
    return args


def _result_line(r: dict) -> str:
    def f(x, d=2):
        return "-" if x is None else f"{x:.{d}f}"

    shape = f"k={r['k']}" if r["tree"] is None else "tree " + ",".join(map(str, r["tree"]))
    return (
        f"{r['draft']:>12s} {r['engine']:>6s} {r['benchmark']:>10s} T={r['temperature']:g} "
        f"C={r['concurrency']} {shape}  tau={f(r['acceptance_length'], 3)}  "
        f"tok/s={f(r['output_tokens_per_s'], 1)}  speedup={f(r['speedup'])}  lossless={r['lossless']}"
    )


def _tree_arg(text: str):
    try:
        return TreeShape.parse(text)
    except ValueError as e:
        raise RecipeError(f"--tree {text}: {e}") from None


def _benchmarks(values):
    """--prompts NAME=FILE or a known name (eval/benchmarks.py HUB_SETS)."""
    return [tuple(v.split("=", 1)) if "=" in v else (v, v) for v in values or []] or None


def _servers(values):
    """--server [NAME=]URL."""
    out = []
    for v in values or []:
        name, url = v.split("=", 1) if "=" in v and not v.startswith("http") else ("server", v)
        out.append((name, url))
    return out or None


def main(argv: list[str] | None = None) -> int:
    """Expected failures end in one line `eyas: error: ...` and exit 2 (bad input) or 1
    (eyas/infra/errors.py); `--debug` anywhere (or EYAS_DEBUG=1) adds their traceback."""
    debug, argv = debugging(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":  # uvicorn shuts down on SIGINT / SIGTERM itself: a normal stop
        return report_failures(lambda: _main(argv), debug)
    with signals_raise():
        return report_failures(lambda: _main(argv), debug)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eyas", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    _recipe_args(sub.add_parser("run", help="run every stage in order (resumes finished ones)"))
    for s in STAGE_ORDER[:-1]:  # eval has its own parser below
        stage = sub.add_parser(s, help=f"run the {s} stage")
        _recipe_args(stage)
        if s in SHARDED:
            stage.add_argument(
                "--shard",
                metavar="I/N",
                help="do slice I of N (0-based) of this stage, e.g. one per machine over a shared "
                "run dir; the last slice to finish joins them (torchrun / accelerate launch "
                "share it out by rank without this)",
            )
    ev = sub.add_parser("eval", help="measure acceptance length with the speculative loop")
    _recipe_args(ev)
    ev.add_argument("--draft", action="append", help="NAME=CHECKPOINT (repeatable); default the run's own")
    ev.add_argument("--k", type=int, action="append", help="chain length (repeatable); default eval.k")
    ev.add_argument("--tree", action="append", help="STEPS,TOPK,NUM_DRAFT_TOKENS dynamic tree (repeatable)")
    ev.add_argument("--concurrency", type=int, action="append", help="requests in flight (repeatable)")
    ev.add_argument(
        "--temperature", type=float, action="append", help="sampling temperature (repeatable; 0 = greedy)"
    )
    ev.add_argument(
        "--prompts",
        action="append",
        help="BENCHMARK=FILE or a known name (mt-bench, humaneval, gsm8k; repeatable); "
        "default the held-out prompts",
    )
    ev.add_argument(
        "--split",
        choices=("test", "tuning"),
        default="test",
        help="test: the prompts above, nothing tuned on them (the default); tuning: the training "
        "conversations held out for validation, where settings are chosen (data/splits.py)",
    )
    ev.add_argument(
        "--server",
        action="append",
        help="[NAME=]URL of an OpenAI-compatible server (vLLM, SGLang, eyas serve) to measure "
        "with the same prompts (repeatable)",
    )
    for name in COMMANDS:
        sub.add_parser(name, help=f"see `eyas {name} --help`", add_help=False)
    return parser


def _main(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:  # export, import, publish, serve, plan, ...: their own parsers
        return _delegate(argv[0], argv[1:])
    args = parse_with_overrides(_parser(), argv)

    recipe, run_dir = recipe_and_run(args.recipe, args.out, args.overrides)
    RUNNERS.get(args.cmd, _stage)(args, recipe, run_dir, not args.no_progress)
    return 0


def _run(args, recipe, run_dir: Path, progress: bool) -> None:
    times = run_all(recipe, run_dir, progress=progress)
    print(f"[eyas] run dir: {run_dir}  (report: {run_dir / REPORT_MD})  stage times: {times}")


def _eval(args, recipe, run_dir: Path, progress: bool) -> None:
    from eyas.eval.evaluate import run_eval  # lazy: numpy, safetensors, torch

    for t in args.tree or []:
        _tree_arg(t)
    if (
        any(k < 1 for k in args.k or [])
        or any(c < 1 for c in args.concurrency or [])
        or any(t < 0 for t in args.temperature or [])
    ):
        raise RecipeError("--k and --concurrency must be >= 1, --temperature >= 0")
    check_target(recipe)
    prepare_run(recipe, run_dir, redo=("eval",))
    report, wall_s, peak = measured(
        lambda: run_eval(
            recipe,
            run_dir,
            drafts=_pairs(args.draft, "--draft") or None,
            ks=args.k,
            trees=args.tree,
            concurrency=args.concurrency,
            temperatures=args.temperature,
            benchmarks=_benchmarks(args.prompts),
            servers=_servers(args.server),
            progress=progress,
            force=True,
            split=args.split,
        )
    )
    # recorded as the eval stage's cost where it ran the recipe's eval, else beside it under its options
    stage = " ".join(["eval", *_eval_options(args)])
    record_stage_cost(run_dir, stage, round(wall_s, 3), peak, 0)
    print(f"[eyas] {stage}: {wall_s:.1f} s{describe(peak)}")
    for r in report["results"]:
        print(f"[eyas] {_result_line(r)}")
    for x in report["recommendation"]:
        print(
            f"[eyas] recommend {x['draft']} {x['benchmark']} T={x['temperature']:g} C={x['concurrency']}: "
            f"{x['choice']} (predicted {x['predicted_speedup']:.2f}x)"
        )
    print(f"[eyas] report: {run_dir / REPORT_JSON}")


def _eval_options(args) -> list[str]:
    """The options and overrides of `eyas eval` that change what it runs, flag by flag ([]: the eval of the
    run's recipe, which prepare_run rewrites with the overrides of each command)."""
    flags = ("draft", "k", "tree", "concurrency", "temperature", "prompts", "server")
    given = [f"--{f} {v}" for f in flags for v in getattr(args, f) or []]
    return given + ([f"--split {args.split}"] if args.split != "test" else []) + list(args.overrides)


def _stage(args, recipe, run_dir: Path, progress: bool) -> None:
    """One stage: prompts, regenerate, capture, vocab or train."""

    if (
        args.cmd != "prompts"
    ):  # the prompts stage reads the data sources only: no target needed (eyas plan --run)
        check_target(recipe)
    prepare_run(recipe, run_dir)
    shard = current_shard(args.shard if args.cmd in SHARDED else None)
    if done_already(run_dir, args.cmd):
        return
    wall_s, peak = run_stage(recipe, run_dir, args.cmd, shard, progress)  # recorded as `eyas run` records it
    print(f"[eyas] {args.cmd}: {wall_s:.1f} s{describe(peak)}", flush=True)


RUNNERS = {"run": _run, "eval": _eval}  # any other command is one stage (_stage)


def _delegate(cmd: str, argv: list[str]) -> int:
    """A command with a parser of its own (eyas/infra/stages.py COMMANDS)."""
    return int(resolve(COMMANDS[cmd])(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
