"""The `eyas` command: one subcommand per stage, and `eyas run RECIPE` for all of them.

    eyas run RECIPE [--out DIR] [key.sub=value ...]      every stage, resuming finished ones
    eyas prompts|regenerate|capture|vocab|train RECIPE_OR_RUN [--out DIR] [overrides]
    eyas eval RECIPE_OR_RUN [--draft NAME=CKPT ...] [--k K ...] [--prompts NAME=FILE ...]
    eyas demo-target [--cache-dir DIR] [--force]
    eyas export | import | publish ...                   see `eyas <cmd> --help`

Training on many GPUs: `accelerate launch -m eyas.train RECIPE --out DIR [overrides]`.
"""

from __future__ import annotations

import argparse
import sys

from eyas.pipeline import STAGE_ORDER
from eyas.recipes.schema import RecipeError



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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # export/import/publish/demo-target have their own parsers
    if argv and argv[0] in ("export", "import", "publish", "demo-target"):
        return _delegate(argv[0], argv[1:])

    parser = argparse.ArgumentParser(prog="eyas", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    _recipe_args(sub.add_parser("run", help="run every stage in order (resumes finished ones)"))
    for s in STAGE_ORDER[:-1]:  # eval has its own parser below
        _recipe_args(sub.add_parser(s, help=f"run the {s} stage"))
    ev = sub.add_parser("eval", help="measure acceptance length with the speculative loop")
    _recipe_args(ev)
    ev.add_argument("--draft", action="append", help="NAME=CHECKPOINT (repeatable); default the run's own")
    ev.add_argument("--k", type=int, action="append", help="draft length (repeatable); default eval.k")
    ev.add_argument("--prompts", action="append", help="BENCHMARK=FILE (repeatable); default held-out prompts")
    for name in ("export", "import", "publish", "demo-target"):
        sub.add_parser(name, help=f"see `eyas {name} --help`", add_help=False)
    args, extra = parser.parse_known_args(argv)  # overrides may also follow the options
    stray = [e for e in extra if e.startswith("-") or "=" not in e]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = list(args.overrides) + extra

    from eyas.pipeline import check_target, prepare_run, recipe_and_run, run_all, stage_fn

    try:
        recipe, run_dir = recipe_and_run(args.recipe, args.out, args.overrides)
        progress = not args.no_progress
        if args.cmd == "run":
            times = run_all(recipe, run_dir, progress=progress)
            print(f"[eyas] run dir: {run_dir}  (report: {run_dir / 'report.md'})  stage times: {times}")
        elif args.cmd == "eval":
            from eyas.eval.evaluate import run_eval

            check_target(recipe)
            prepare_run(recipe, run_dir)
            report = run_eval(recipe, run_dir, drafts=_pairs(args.draft, "--draft") or None, ks=args.k,
                              benchmarks=_pairs(args.prompts, "--prompts") or None, progress=progress,
                              force=True)
            for r in report["results"]:
                print(f"[eyas] {r['draft']:>12s} {r['benchmark']:>10s} k={r['k']}  "
                      f"tau={r['acceptance_length']:.3f}  lossless={r['lossless']}")
            print(f"[eyas] report: {run_dir / 'report.json'}")
        else:
            check_target(recipe)
            prepare_run(recipe, run_dir)
            stage_fn(args.cmd)(recipe, run_dir, progress=progress)
    except RecipeError as e:
        print(f"eyas: recipe error: {e}", file=sys.stderr)
        return 2
    return 0


def _delegate(cmd: str, argv: list[str]) -> int:
    if cmd == "demo-target":
        from eyas.demo_target.build import main_demo_target as fn
    elif cmd == "export":
        from eyas.serve.export import main_export as fn
    elif cmd == "import":
        from eyas.serve.importer import main_import as fn
    else:
        from eyas.serve.publish import main_publish as fn
    return int(fn(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
