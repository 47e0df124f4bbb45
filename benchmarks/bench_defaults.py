"""Re-deciding a recipe's defaults: each table's choices trained from the same capture with several seeds,
so that the noise between seeds is measured next to the differences between choices.

    python benchmarks/bench_defaults.py --recipe recipes/smollm2-135m.yaml --out runs/defaults \
        [--tables options lm_head peers batching rows losses ttt optim storage] [--seeds 0 1] [--eval] \
        [--split tuning|test] \
        [key.sub=value ...]

The recipe's prompts, regeneration, capture and vocab run once (OUT/_base); every choice is the recipe
with its table's overrides (below; N is the target's layer count) and `train.seed=S`, in OUT/<table>/
<choice>-s<S>, whose earlier stages are links to the base run's (a choice that changes the capture
captures once, into OUT/<table>/<choice>-capture, for all its seeds). Each is scored by training's
validation on the tuning split (data/splits.py: whole conversations held out, `train.val_fraction`, the same
for every seed): simulated tau at k = 1..5 (greedy chains, the acceptance rule of the serving loop) and, on
greedy data, replayed tau (the greedy loop's own rounds along the held-out text, train/validation.py); with
--eval, also by `eyas eval` on --split (default tuning: the held-out conversations' first prompts; test, the
recipe's eval prompts, is refused while a table compares choices: defaults are never chosen on it).
Everything runs in this one process (on a GPU the CUDA context is made once). Prints one JSON line per
trained choice, then per table: the mean over seeds at each k, each seed's value at the recipe's eval.k,
and the spread between seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from eyas.data.splits import TUNE_ON, split_seed
from eyas.infra import layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

BASE_STAGES = ("prompts", "regenerate", "capture", "vocab")
KS = (1, 2, 3, 4, 5)
# speculators 0.9's draft (its three norms, the target's lm_head rows frozen) and its training besides the
# optimizer (lr 1e-3, AdamW weight decay 0.01, every TTT step weighed the same)
SPECULATORS_DRAFT = [
    "draft.norm_before_fc=true",
    "draft.norm_before_residual=true",
    "draft.norm_output=true",
    "draft.lm_head=target_frozen",
]
SPECULATORS_TRAIN = ["train.lr=1e-3", "train.weight_decay=0.01", "train.decay=1.0"]
PACKED_1024 = ["train.pack=true", "train.max_length=1024", "train.batch_size=1"]  # speculators' rows
MUON = ["train.optimizer=muon", "train.weight_decay=0.01"]
TABLES = {  # table -> choice -> overrides ({n}: the target's layer count, {h}: n // 2)
    "options": {
        "plain": ["draft.norm_before_fc=false"],
        "norm_before_fc": ["draft.norm_before_fc=true"],
        "norm_before_residual": ["draft.norm_before_fc=false", "draft.norm_before_residual=true"],
        "aux_ids_2_h_N": ["draft.norm_before_fc=false", "capture.aux_layer_ids=[2,{h},{n}]"],
        "two_layers": ["draft.norm_before_fc=false", "draft.num_layers=2"],
        "norm_output": ["draft.norm_output=true"],
        "fc_and_residual": ["draft.norm_before_fc=true", "draft.norm_before_residual=true"],
        # speculators 0.9's three switches together
        "fc_residual_output": [
            "draft.norm_before_fc=true",
            "draft.norm_before_residual=true",
            "draft.norm_output=true",
        ],
    },
    "lm_head": {  # EAGLE-3 / SpecForge: random and trained; speculators: the target's rows, frozen
        "random": ["draft.lm_head=random"],
        "target": ["draft.lm_head=target"],
        "target_frozen": ["draft.lm_head=target_frozen"],
    },
    "peers": {  # the anchors' defaults as eyas recipe keys (benchmarks/bench_anchors.py runs their own code)
        "speculators_defaults": [*SPECULATORS_DRAFT, "train.optimizer=muon", *SPECULATORS_TRAIN],
        # the same but AdamW: is it Muon that loses in the combination?
        "speculators_adamw": [*SPECULATORS_DRAFT, "train.optimizer=adamw", *SPECULATORS_TRAIN],
        "specforge_defaults": [
            "draft.norm_before_fc=false",
            "draft.lm_head=random",
            "train.optimizer=adamw",
            "train.lr=1e-4",
            "train.decay=0.8",
        ],
    },
    "batching": {  # rows of whole sequences padded to the batch's longest, or packed (speculators packs)
        "padded_b8": ["train.pack=false", "train.batch_size=8"],
        "packed_768_b2": ["train.pack=true", "train.max_length=768", "train.batch_size=2"],
        "packed_1024_b1": PACKED_1024,
        "packed_1024_b1_muon": [*PACKED_1024, *MUON],  # speculators' rows and optimizer
        # and the target's lm_head rows, frozen
        "packed_1024_b1_muon_frozen_head": [*PACKED_1024, *MUON, "draft.lm_head=target_frozen"],
        # and speculators' schedule shape: 1% warmup, decay to 0
        "packed_1024_b1_muon_frozen_head_to_0": [
            *PACKED_1024,
            *MUON,
            "draft.lm_head=target_frozen",
            "train.warmup_ratio=0.01",
            "train.min_lr_ratio=0",
        ],
    },
    "losses": {
        "kl": ["train.loss=kl"],
        "lk": ["train.loss=lk"],
        "ce": ["train.loss=ce"],
        "kl_decay_1": ["train.loss=kl", "train.decay=1.0"],  # speculators: every step weighed the same
    },
    "rows": {  # packed rows, one per step: 1024 tokens (the recipe's and speculators') against shorter ones
        "rows_384": ["train.pack=true", "train.max_length=384", "train.batch_size=1"],
        "rows_512": ["train.pack=true", "train.max_length=512", "train.batch_size=1"],
        "rows_1024": PACKED_1024,
    },
    "ttt": {"ttt3": ["train.ttt_steps=3"], "ttt5": ["train.ttt_steps=5"], "ttt7": ["train.ttt_steps=7"]},
    "optim": {  # the recipe trains with Muon (train.optimizer) at lr 3e-3; its lm_head is frozen
        "adamw_1e-4": ["train.optimizer=adamw", "train.lr=1e-4"],  # SpecForge's default
        "adamw_5e-4": ["train.optimizer=adamw", "train.lr=5e-4"],
        "adamw_1e-3": ["train.optimizer=adamw", "train.lr=1e-3"],
        "adamw_3e-3": ["train.optimizer=adamw", "train.lr=3e-3"],
        # speculators' default: Muon lr 1e-3 wd 0.1 on the matrices, AdamW lr 1e-3 wd 0.01 on the rest
        "muon_1e-3": ["train.optimizer=muon", "train.lr=1e-3", "train.weight_decay=0.01"],
        "muon_2e-3": ["train.optimizer=muon", "train.lr=2e-3", "train.weight_decay=0.01"],
        "muon_3e-3": ["train.optimizer=muon", "train.lr=3e-3", "train.weight_decay=0.01"],
        "muon_5e-3": ["train.optimizer=muon", "train.lr=5e-3", "train.weight_decay=0.01"],
    },
    "storage": {
        "bf16": ["capture.aux_format=same", "capture.teacher=final"],
        "topk": ["capture.aux_format=same", "capture.teacher=topk"],
        "fp8_topk": ["capture.aux_format=fp8", "capture.teacher=topk"],
        "int6_topk": ["capture.aux_format=int6", "capture.teacher=topk"],
        "int4_topk": ["capture.aux_format=int4", "capture.teacher=topk"],
    },
}


def overrides(table: str, choice: str, n: int) -> list[str]:
    return [o.format(n=n, h=n // 2) for o in TABLES[table][choice]]


def link_stages(run: Path, src: Path, stages: tuple[str, ...]) -> None:
    """`run` with links to `src`'s finished `stages`."""
    run.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        if not (run / stage).exists():
            (run / stage).symlink_to((src / stage).resolve(), target_is_directory=True)


def stages_for(args, base: Path, table: str, choice: str, mine: list[str]) -> Path:
    """The run whose prompts, regeneration, capture and vocab a choice trains on: the base run, or (a choice
    that changes the capture) OUT/<table>/<choice>-capture, captured once for all seeds."""
    if not any(o.startswith("capture.") for o in mine):
        return base
    src = Path(args.out) / table / f"{choice}-capture"
    link_stages(src, base, BASE_STAGES[:2])
    run_all(load_recipe(args.recipe, args.overrides + mine), src, stages=BASE_STAGES, progress=False)
    return src


def score(run: Path) -> dict:
    """Training's validation: simulated tau at each k of KS that training unrolled, and the replayed tau
    (the greedy loop's own rounds along the held-out text, where that is the target's greedy text)."""
    done = layout.read_done(run, "train")
    val = done["validation"]
    sim, t1, rep = val["simulated_tau"], val.get("simulated_tau_t1", []), val.get("replayed_tau", [])
    return {
        "sim_tau": {k: sim[k - 1] for k in KS if k <= len(sim)},
        "sim_tau_t1": {k: t1[k - 1] for k in KS if k <= len(t1)},
        "replayed_tau": {k: rep[k - 1] for k in KS if k <= len(rep)},
        "train_s": done.get("run_wall_s", done["wall_s"]),  # a resumed run: all its processes
        "tokens_seen": done["tokens_seen"],
        "params": done["trainable_parameters"],
    }


def loop_tau(recipe, run: Path, split: str) -> dict:
    """`eyas eval` on `split` (tuning: the held-out conversations' first prompts; test: the recipe's eval
    prompts): tau per (benchmark, temperature, k) and losslessness."""
    from eyas.eval.evaluate import run_eval

    report = run_eval(recipe, run, force=True, progress=False, split=split)
    rows = [r for r in report["results"] if r.get("k") is not None]
    return {
        "tau": {f"{r['benchmark']} T={r['temperature']:g} k={r['k']}": r["acceptance_length"] for r in rows},
        "lossless": all(r["lossless"] for r in rows if r["lossless"] is not None),
    }


def loop_drafts(
    recipe, out: Path, base: Path, drafts: list[tuple[str, str]], temperatures: list[float]
) -> dict:
    """(name, checkpoint) drafts in eyas's loop on the test split (the recipe's eval prompts, nothing tuned
    on them), in one eval in `out` (its stages linked to `base`), at the recipe's eval.k
    -> {(draft, temperature): tau over all benchmarks, weighed by their target forwards}."""
    from eyas.eval.evaluate import run_eval

    link_stages(out, base, BASE_STAGES)
    k = recipe.eval.k
    report = run_eval(
        recipe, out, drafts=drafts, ks=[k], trees=[], temperatures=temperatures, force=True, split="test"
    )
    tau: dict[tuple, list] = {}
    for r in report["results"]:
        tau.setdefault((r["draft"], r["temperature"]), []).append(
            (r["acceptance_length"], r["target_forwards"])
        )
    return {key: sum(a * f for a, f in v) / sum(f for _, f in v) for key, v in tau.items()}


def train_choice(args, base: Path, table: str, choice: str, seed: int, n: int) -> dict:
    mine = overrides(table, choice, n)
    over = args.overrides + mine + [f"train.seed={seed}", f"train.val_seed={args.val_seed}"]
    run = Path(args.out) / table / f"{choice}-s{seed}"
    recipe = load_recipe(args.recipe, over)
    link_stages(run, stages_for(args, base, table, choice, mine), BASE_STAGES)
    t0 = time.perf_counter()
    run_all(recipe, run, stages=(*BASE_STAGES, "train"), progress=False)
    row = {"table": table, "choice": choice, "seed": seed, "overrides": over, **score(run)}
    if args.eval:
        row["loop"] = loop_tau(recipe, run, args.split)
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


METRICS = {"sim_tau": "simulated tau", "replayed_tau": "replayed tau"}


def summary(rows: list[dict], k_headline: int) -> list[str]:
    """Per table and metric (simulated, and replayed where validation gave it): the mean over seeds at each k,
    each seed's at k_headline, the seed spread."""
    lines = []
    for table in dict.fromkeys(r["table"] for r in rows):
        mine = [r for r in rows if r["table"] == table]
        for metric, name in METRICS.items():
            if any(r.get(metric) for r in mine):
                lines += table_lines(mine, table, metric, name, k_headline)
    return lines


def table_lines(rows: list[dict], table: str, metric: str, name: str, k_headline: int) -> list[str]:
    lines = ["", f"{table}: {name} (mean over seeds) at k = {', '.join(map(str, KS))}"]
    lines.append(f"{'choice':<22}" + "".join(f"{f'k={k}':>8}" for k in KS) + f"   per seed at k={k_headline}")
    spreads = []
    for choice in dict.fromkeys(r["choice"] for r in rows):
        mine = [r[metric] for r in rows if r["choice"] == choice]
        means = [sum(m[k] for m in mine) / len(mine) if all(k in m for m in mine) else None for k in KS]
        seeds = [m.get(k_headline) for m in mine]
        if None not in seeds and len(seeds) > 1:
            spreads.append(max(seeds) - min(seeds))
        cells = "".join(f"{m:>8.3f}" if m is not None else f"{'-':>8}" for m in means)
        per_seed = " / ".join(f"{s:.3f}" if s is not None else "-" for s in seeds)
        lines.append(f"{choice:<22}{cells}   {per_seed}")
    if spreads:
        lines.append(
            f"seed spread at k={k_headline}: max {max(spreads):.3f}, mean {sum(spreads) / len(spreads):.3f}"
        )
    return lines


def refuse_tuning_on_test(split: str, chosen: list[tuple[str, str]]) -> None:
    """A table compares choices: on the test split that would tune on the prompts the reported numbers
    come from (data/splits.py). There, each table may measure only the one choice made on tuning."""
    tables = [t for t in dict.fromkeys(t for t, _ in chosen) if sum(t2 == t for t2, _ in chosen) > 1]
    if split not in TUNE_ON and tables:
        raise SystemExit(
            f"bench_defaults: --split {split} would compare {len(chosen)} choices of {', '.join(tables)} on "
            "prompts nothing may be tuned on; choose on --split tuning, then measure the chosen one with "
            f"--choices NAME --split {split}"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/smollm2-135m.yaml")
    p.add_argument("--out", default="runs/defaults")
    p.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    p.add_argument("--choices", nargs="+", default=None, help="only these choices, in this order")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--eval", action="store_true", help="also evaluate each choice in the serving loop")
    p.add_argument(
        "--split",
        choices=("tuning", "test"),
        default="tuning",
        help="the prompts --eval measures on (data/splits.py); test: one choice per table, chosen before",
    )
    p.add_argument("--results", default=None, help="where each row is appended (default OUT/results.jsonl)")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value) for every choice")
    args = p.parse_args(argv)
    from eyas.data.target import load_target_config, text_config

    recipe = load_recipe(args.recipe, args.overrides)
    base = Path(args.out) / "_base"
    run_all(recipe, base, stages=BASE_STAGES, progress=False)
    n = text_config(load_target_config(recipe.target.model)).num_hidden_layers
    chosen = [(t, c) for t in args.tables for c in TABLES[t]]  # in --choices' order where given
    if args.choices:
        chosen = [(t, c) for c in args.choices for t, c2 in chosen if c2 == c]
    refuse_tuning_on_test(args.split, chosen)
    args.val_seed = split_seed(recipe.train)  # every seed validates on the base run's tuning conversations
    rows = []
    with open(args.results or Path(args.out) / "results.jsonl", "a") as log:
        for seed in args.seeds:  # seed-major: a run cut short still has whole tables for its first seeds
            for table, choice in chosen:
                rows.append(train_choice(args, base, table, choice, seed, n))
                print(json.dumps(rows[-1]), file=log, flush=True)
                print(json.dumps(rows[-1]), flush=True)
    print("\n".join(summary(rows, recipe.eval.k)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
