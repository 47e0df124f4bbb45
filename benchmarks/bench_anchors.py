"""eyas against the anchors' own trainers: speculators 0.9.0 and SpecForge 0.2.0 trained from the same eyas
capture, for the same number of epochs over the same sequences, imported with `eyas import`, and evaluated
side by side in eyas's serving loop on the same prompts of one split (data/splits.py).

    python benchmarks/bench_anchors.py --run runs/smollm2-135m --split tuning|test [--work peer-work]
        [--epochs 2] [--ttt 5] [--seeds 0 1] [--trainers eyas speculators specforge] [--name eyas]
        [--lr TRAINER=LR[,LR...]] [--speculators-rows 1024] [--k 1 2 3 4 5] [--temperature 0 1]
        [--eval-seeds 0 1 2] [--num-prompts 8] [--no-eval] [--no-scores] [--probe N] [-- key.sub=value ...]

Each trainer at its best: sweep its lr on the tuning split (`--split tuning --lr specforge=1e-4,3e-4,1e-3`,
one draft per lr and seed, named `specforge-lr0.0003-sS`), then report every trainer at the lr that won there
with `--split test --lr specforge=...` (a sweep on the test split is refused).

Needs a finished eyas run (its capture and vocab: `eyas run recipes/smollm2-135m.yaml`) and the peers'
venv and target directory from `../shared/peer/README.md` (Setup: `$PEER_WORK/venv` with speculators,
specforge and transformers 5.8.1; `make_smollm2.py` writes `$PEER_WORK/smollm2-135m-instruct`, built
here when missing). The peers' launchers and converters run from `--peer` (default ../shared/peer);
nothing of theirs is copied. Each stage writes into WORK and is skipped when its output is there:

    generic/             the capture as the peers' generic layout: seq_XXXXXX.safetensors {input_ids,
                         loss_mask, aux_hidden_states (3, T, H) = HF hidden_states[k] for the run's
                         aux_layer_ids (vLLM convention: id k = input of decoder layer k),
                         final_hidden_state (T, H) after the final norm}, eyas's training sequences
                         first and its held-out validation sequences (train.val_fraction) after them;
                         vocab_mapping.pt {d2t offsets, t2d}
    generic-train/       links to the training sequences only (SpecForge has no validation split)
    data/speculators, data/specforge   the peers' converters' output
    <trainer>-s<S>/      each trainer's run; eyas's (named --name) links the run's stages and trains with its
                         recipe and the command line's overrides
    imported/<trainer>-s<S>   the peers' checkpoints read by `eyas import`
    exported/<trainer>-s<S>   every trained draft exported for vLLM (eagle3 layout), kept to re-measure
    probe-<N>x<tokens>-<dtype>-<benchmarks>/   (--probe N) the loop's prompts answered greedily by the target
                         and captured

Every trainer keeps its own defaults (optimizer, lr, schedule, loss and its weighting, lm_head init
and freezing, norms, tokens per step: eyas's packed rows of its recipe's train.max_length, SpecForge's one
sequence) except what makes the budget the same: the draft shape (1 layer, the target's dims, the run's aux
ids and draft vocab), TTT steps (--ttt), epochs over the same training sequences and the seed. speculators'
packed rows (--total-seq-len, its default 8192: a few dozen steps here) are --speculators-rows, default
--max-length. Tokens/s is the sequences' tokens (prompt and answer) times epochs over each trainer's wall
time, one trainer at a time on the same machine.
Every draft is scored twice: on the tuning split's captured sequences as eyas's training validates (simulated
tau of greedy chains and at T = 1, the same sequences and teacher for all, no sampling noise), and in eyas's
serving loop on --split's prompts (unless --no-eval); with --probe (test split) also as on the held-out
sequences, on the target's own greedy answers to the loop's prompts (the loop's text, paired, without its
noise). Prints one JSON line per trained draft, per draft's held-out score and per measured point (appended
to WORK/results.jsonl), then the tables: per trainer, mean over seeds at each k (and temperature), the loop's
over all prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from eyas.data.shards import ShardDataset
from eyas.data.splits import TUNE_ON, held_out_split, run_groups, split_seed
from eyas.eval.load import bootstrap_interval, tau_draws
from eyas.eval.replay import score_drafts
from eyas.infra import layout
from eyas.pipeline import answers_run, run_all
from eyas.recipes.load import load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_defaults import BASE_STAGES, link_stages  # noqa: E402

TRAINERS = ("eyas", "speculators", "specforge")


def export_generic(run: Path, recipe, out: Path) -> dict:
    """The run's capture as the generic layout (module docstring), training sequences first -> meta."""
    meta_path = out / "meta.json"
    if meta_path.is_file():
        return json.loads(meta_path.read_text())
    seqs = ShardDataset(run / "capture")
    if seqs.teacher != "final":
        raise SystemExit(f"{run}/capture: the peers need the final state (capture.teacher: final)")
    train_ids, val_ids = held_out_split(recipe.train, run_groups(run, len(seqs)))
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    n_aux, H = len(seqs.aux_layer_ids), seqs.hidden_size
    for j, i in enumerate(train_ids + val_ids):
        s = seqs[i]
        T = len(s["input_ids"])
        save_file(
            {
                "input_ids": s["input_ids"],
                "loss_mask": s["loss_mask"].to(torch.int64),
                "aux_hidden_states": s["aux"].reshape(T, n_aux, H).transpose(0, 1).contiguous(),
                "final_hidden_state": s["final"].contiguous(),
            },
            str(tmp / f"seq_{j:06d}.safetensors"),
        )
    vocab = load_file(str(run / "vocab" / "vocab.safetensors"))
    torch.save({"d2t": vocab["d2t"], "t2d": vocab["t2d"]}, tmp / "vocab_mapping.pt")
    tokens = [seqs.lengths[i] for i in train_ids]
    meta = {
        "val_seed": split_seed(recipe.train),
        "aux_layer_ids": seqs.aux_layer_ids,
        "layer_id_convention": "vLLM: id k = input of decoder layer k = HF hidden_states[k]",
        "n_train": len(train_ids),
        "n_val": len(val_ids),
        "train_tokens": sum(tokens),
        "max_length": max(tokens),
        "draft_vocab_size": int(vocab["d2t"].numel()),
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    tmp.rename(out)
    train_only = out.with_name(out.name + "-train")
    train_only.mkdir(exist_ok=True)
    for name in [f"seq_{j:06d}.safetensors" for j in range(len(train_ids))] + ["vocab_mapping.pt"]:
        if not (train_only / name).exists():
            (train_only / name).symlink_to((out / name).resolve())
    return meta


def peer(args, script: str, *argv: str, log: Path) -> float:
    """Run one of ../shared/peer's scripts with the peers' python; its output to `log` -> wall seconds."""
    env = {**os.environ, "PEER_WORK": str(args.work), "SMOL_DIR": str(args.target_dir)}
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        done = subprocess.run(
            [str(args.peer_python), str(args.peer / script), *argv],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    if done.returncode:
        tail = log.read_text().splitlines()[-15:]
        raise SystemExit(f"{script} failed ({done.returncode}), see {log}:\n" + "\n".join(tail))
    return time.perf_counter() - t0


def timed(out: Path, train) -> dict:
    """Run `train()` once (-> checkpoint dir) and keep its wall time in out/timing.json -> that record."""
    rec_path = out / "timing.json"
    if rec_path.is_file():
        return json.loads(rec_path.read_text())
    t0 = time.perf_counter()
    ckpt = train()
    rec = {"checkpoint": str(ckpt), "wall_s": round(time.perf_counter() - t0, 1)}
    rec_path.write_text(json.dumps(rec))
    return rec


def train_eyas(args, meta: dict, seed: int, lr: float | None) -> dict:
    """eyas's own recipe (the run's, with the command line's overrides; train.lr=`lr` when given), trained
    in WORK/<--name>[-lrLR]-s<S> on the run's linked capture and vocab, holding out the tuning conversations
    the peers do not train on either (train.val_seed)."""
    out = args.work / f"{trainer_name(args, 'eyas', lr)}-s{seed}"
    over = [*args.overrides, *budget(args), f"train.seed={seed}", f"train.val_seed={meta['val_seed']}"]
    over += [f"train.lr={lr}"] if lr else []

    def train() -> Path:
        link_stages(out, args.run, BASE_STAGES)
        run_all(load_recipe(args.recipe, over), out, stages=(*BASE_STAGES, "train"), progress=False)
        return out / layout.FINAL_CHECKPOINT

    return timed(out, train)


def budget(args) -> list[str]:
    """The overrides that give eyas the shared budget (DFlash: the block of --ttt + 1 and --anchors)."""
    block = [f"train.max_anchors={args.anchors}"] if args.kind == "dflash" else []
    return [f"train.epochs={args.epochs}", f"train.ttt_steps={args.ttt}", f"draft.kind={args.kind}", *block]


def trainer_name(args, trainer: str, lr: float | None) -> str:
    """The drafts' name: the trainer (eyas's: --name), then its lr where --lr set one (`specforge-lr0.001`),
    then speculators' row length where it is not --max-length (`speculators-lr0.003-rows512`); a peer's
    P-EAGLE drafts carry the kind (`speculators-peagle-lr0.003`, `eyas-peagle-s0`)."""
    kind = "" if args.kind == "eagle3" else f"-{args.kind}"
    name = (args.name if trainer == "eyas" else trainer) + kind + (f"-lr{lr:g}" if lr else "")
    if trainer == "speculators" and args.speculators_rows != args.max_length:
        name += f"-rows{args.speculators_rows}"
    return name


def train_speculators(args, meta: dict, seed: int, lr: float | None) -> dict:
    """`speculators train` (launch_speculators_cpu.py) with its defaults (its lr unless `lr`: its Muon and
    AdamW groups both), the last epoch's checkpoint."""
    out = args.work / f"{trainer_name(args, 'speculators', lr)}-s{seed}"
    n = meta["n_train"] + meta["n_val"]

    def train() -> Path:
        peer(
            args,
            "launch_speculators_cpu.py",
            "--verifier-name-or-path",
            str(args.target_dir.resolve()),
            "--data-path",
            str(args.work / "data" / "speculators"),
            "--speculator-type",
            args.kind,
            "--draft-vocab-size",
            str(meta["draft_vocab_size"]),
            "--target-layer-ids",
            *map(str, meta["aux_layer_ids"]),
            "--full-attention-indices",
            "0",
            *depth_flags(args),
            "--total-seq-len",
            str(args.speculators_rows),
            # its row-ordered split: int(n * ratio) rows = eyas's training sequences
            "--train-data-ratio",
            f"{(meta['n_train'] + 0.5) / n:.8f}",
            "--epochs",
            str(args.epochs),
            "--seed",
            str(seed),
            "--save-path",
            str(out / "ckpt"),
            "--log-freq",
            "10",
            "--no-resume-from-checkpoint",
            *(["--lr", str(lr)] if lr else []),
            log=out / "train.log",
        )
        return out / "ckpt" / f"epoch{args.epochs - 1}_end"

    out.mkdir(parents=True, exist_ok=True)
    return timed(out, train)


def depth_flags(args) -> list[str]:
    """speculators' flags for --ttt: TTT steps of an EAGLE-3 draft, the depths of a P-EAGLE draft, the drafts
    of a DFlash block (--block-size --ttt + 1, --max-anchors --anchors, every layer full attention; its
    other DFlash settings are its defaults: 5 Qwen3 layers, D-PACE over the block, cross-entropy; eyas's
    default layers are the same 5). Its other
    P-EAGLE settings are its defaults: COD 0.7 / 0.2 as eyas's, at most 512 anchors a packed row
    (--max-anchors; eyas keeps every counted position), and a trained embedding (its P-EAGLE model ignores
    --no-embed-requires-grad; `eyas import` keeps the table as the draft's own, DraftConfig.own_embedding). A
    P-EAGLE draft's layer is set to Llama's: speculators defaults it to Qwen3's (q/k norms), which vLLM's
    llama_eagle3 (the P-EAGLE it serves) and `eyas import` do not load."""
    if args.kind == "peagle":
        return ["--num-depths", str(args.ttt), "--draft-arch", "llama"]
    if args.kind == "dflash":  # its DFlash defaults otherwise: 5 Qwen3 layers, D-PACE, CE
        # every layer full attention, non-causal in the block (DFlash's, z-lab's and eyas's layer): by default
        # speculators makes its layers sliding-window ones, causal in the block (sliding_window_non_causal
        # false), which vLLM's update_dflash then serves causal on every layer, its full ones included
        full = ["--full-attention-indices", *map(str, range(5))]
        return ["--block-size", str(args.ttt + 1), "--max-anchors", str(args.anchors), *full]
    return ["--ttt-steps", str(args.ttt)]


def train_specforge(args, meta: dict, seed: int, lr: float | None) -> dict:
    """`specforge train` (launch_specforge_cpu.py, the peers' CPU config) with its defaults (its lr 1e-4
    unless `lr`: training.learning_rate), exported to the HF layout with `specforge export --to hf`."""
    out = args.work / f"{trainer_name(args, 'specforge', lr)}-s{seed}"
    data = args.work / "data" / "specforge"
    steps = args.epochs * meta["n_train"]  # batch 1, no packing: one sequence per step

    def train() -> Path:
        peer(
            args,
            "launch_specforge_cpu.py",
            "train",
            "-c",
            str(args.peer / "configs" / "specforge_smol_cpu.yaml"),
            f"model.target_model_path={data / 'target_view'}",
            f"model.draft_model_config={data / 'draft_config.json'}",
            f"model.vocab_mapping_path={data / 'vocab_mapping.pt'}",
            f"data.hidden_states_path={data / 'features'}",
            f"data.cache_dir={args.work / 'cache'}",
            f"data.max_length={args.max_length}",
            f"output_dir={out / 'run'}",
            f"training.num_epochs={args.epochs}",
            f"training.max_steps={steps}",
            f"training.save_interval={steps}",
            "training.log_interval=50",
            f"training.ttt_length={args.ttt}",
            f"training.seed={seed}",
            *([f"training.learning_rate={lr}"] if lr else []),
            log=out / "train.log",
        )
        return out / "hf"

    out.mkdir(parents=True, exist_ok=True)
    rec = timed(out, train)
    if not (out / "hf" / "config.json").is_file():
        peer(
            args,
            "launch_specforge_cpu.py",
            "export",
            "--to",
            "hf",
            "--checkpoint",
            str(out / "run" / f"smol-eagle3-cpu-step{steps}"),
            "--draft-config",
            str(data / "draft_config.json"),
            "--output-dir",
            str(out / "hf"),
            "--vocab-mapping",
            str(data / "vocab_mapping.pt"),
            "--embedding-source",
            str(data / "target_view"),
            log=out / "export.log",
        )
    return rec


TRAIN = {"eyas": train_eyas, "speculators": train_speculators, "specforge": train_specforge}


def imported(args, name: str, trainer: str, ckpt: str, target: str) -> str:
    """A peer's checkpoint read by `eyas import` into WORK/imported/<name> (eyas's own: as it is)."""
    if trainer not in CONVERTERS:  # eyas's own
        return ckpt
    out = args.work / "imported" / name
    if not (out / "config.json").is_file():
        from eyas.serve.interchange.importer import import_draft

        import_draft(ckpt, out, target=target)
    return str(out)


def exported(args, name: str, ckpt: str) -> None:
    """The draft exported for vLLM (`eyas export --engines vllm` in its kind's layout, re-read and checked) in
    WORK/exported/<name>, once: kept so that anyone can serve and re-measure it. vLLM only: the peers'
    speculators drafts carry `norm_output`, which SGLang and TensorRT-LLM do not load."""
    from eyas.serve.interchange.export import export
    from eyas.train.checkpoint import read_config
    from eyas.train.kinds import kind_named

    out = args.work / "exported" / name
    if not (out / "config.json").is_file():
        export(ckpt, kind_named(read_config(ckpt).kind).formats[0], out, engines=("vllm",))


def held_out_tau(args, recipe, drafts: list[tuple[str, str]]) -> list[dict]:
    """Every draft scored as eyas's training scores its own (train/validation.py): TTT over the captured
    sequences no trainer trained on, simulated tau of chains at k = 1..--ttt, greedy and at T = 1, in the
    recipe's training precision -> one row per draft. The same sequences and teacher for all: no
    serving-loop noise."""
    seqs = ShardDataset(args.run / "capture")
    val = held_out_split(recipe.train, run_groups(args.run, len(seqs)))[1]
    return scored_rows(recipe, seqs, val, drafts, args, "held-out captured sequences")


def probe_tau(args, recipe, drafts: list[tuple[str, str]]) -> list[dict]:
    """Every draft scored as `held_out_tau` on the loop's own prompts answered by the target: the probe
    capture (`probe_capture`), all its sequences."""
    seqs = ShardDataset(probe_capture(args, recipe))
    label = f"probe: the loop's prompts ({args.probe} per benchmark), the target's greedy answers"
    if max(seqs.lengths) > args.max_length:
        raise SystemExit(f"--max-length {args.max_length}: the probe holds a sequence of {max(seqs.lengths)}")
    return scored_rows(recipe, seqs, list(range(len(seqs))), drafts, args, label, sampled_text=False)


def scored_rows(recipe, seqs, indices: list[int], drafts, args, label: str, sampled_text=None) -> list[dict]:
    """`score_drafts` (eval/replay.py) -> one row per draft: its simulated tau at k = 1..--ttt, greedy and at
    T = 1, and its replayed tau."""
    scored = score_drafts(recipe, seqs, indices, drafts, args.ttt, args.max_length, sampled_text)
    return [
        {
            "draft": name,
            "scored_on": label,
            "held_out_sequences": len(indices),
            "sim_tau": m["simulated_tau"],
            "sim_tau_t1": m["simulated_tau_t1"],
            "replayed_tau": m["replayed_tau"],
        }
        for name, m in scored
    ]


def probe_capture(args, recipe) -> Path:
    """The serving loop's own prompts (eval's `spread` of --probe per benchmark of the recipe's
    eval.benchmarks: the loop's very prompts when --probe is --num-prompts) answered greedily by the target
    as the loop's target answers them (eyas/pipeline.py `answers_run`: HF generate, --eval-dtype, up to
    eval.max_new_tokens), then captured: WORK/probe-<N>x<tokens>-<dtype>-<benchmarks>/, once -> its capture
    directory. Drafts scored on it are scored on the loop's text without the loop's batching and sampling
    noise; its replayed tau is the greedy loop's."""
    from eyas.eval.benchmarks import load_benchmark

    ev = recipe.eval
    out = args.work / f"probe-{args.probe}x{ev.max_new_tokens}-{args.eval_dtype}-{'-'.join(ev.benchmarks)}"
    messages = [
        m
        for name, src in ev.benchmarks.items()
        for m in load_benchmark(name, src, recipe.data.system_prompt, args.probe).messages
    ]
    return answers_run(args.recipe, messages, out, [*args.overrides, f"target.dtype={args.eval_dtype}"])


def held_out_table(rows: list[dict]) -> list[str]:
    """Per trainer: held-out simulated tau, mean over seeds (each seed), at k = 1..., greedy then T = 1, then
    greedy replayed (the loop's own rounds along the text: train/validation.py)."""
    return (
        held_out_lines(rows, "sim_tau", "greedy")
        + held_out_lines(rows, "sim_tau_t1", "T=1")
        + held_out_lines(rows, "replayed_tau", "greedy, replayed")
    )


def held_out_lines(rows: list[dict], key: str, label: str) -> list[str]:
    """One table of `held_out_table`: rows[...][key] per k."""
    ks = range(1, len(rows[0][key]) + 1)
    n, on = rows[0]["held_out_sequences"], rows[0]["scored_on"]
    lines = ["", f"{n} {on}: simulated tau ({label}), mean over seeds (each seed)"]
    lines.append(f"{'trainer':<16}" + "".join(f"{f'k={k}':>22}" for k in ks))
    for fam in dict.fromkeys(family(r["draft"]) for r in rows):
        mine = [r[key] for r in rows if family(r["draft"]) == fam]
        cells = [(sum(t[k - 1] for t in mine) / len(mine), [t[k - 1] for t in mine]) for k in ks]
        each = ["/".join(f"{x:.2f}" for x in e) for _, e in cells]
        lines.append(f"{fam:<16}" + "".join(f"{m:>8.3f} ({e})" for (m, _), e in zip(cells, each)))
    return lines


def eval_dtype_overrides(dtype: str) -> list[str]:
    """The loop's target in `dtype`. A bf16 target's batched greedy outputs vary with the batch's shape, so
    below fp32 the lossless check is left to the recipe's own (fp32) eval and only tau is compared."""
    return [f"eval.target_dtype={dtype}"] + ([] if dtype == "float32" else ["eval.check_lossless=false"])


def evaluate(args, drafts: list[tuple[str, str]]) -> list[dict]:
    """Every draft in eyas's serving loop, one target load per eval seed, on --split: the recipe's eval
    benchmarks (test) or the tuning conversations' first prompts, --num-prompts of each, chains k = args.k at
    each temperature; greedy once, T > 0 once per --eval-seeds (request i samples with seed + i) -> one row
    per (draft, benchmark, temperature, k, eval seed), with its per-prompt counts (the tables' intervals).
    """
    from eyas.eval.evaluate import run_eval

    out = args.work / "eval"
    link_stages(out, args.run, BASE_STAGES)
    keys = ("draft", "benchmark", "temperature", "k", "acceptance_length", "target_forwards", "lossless")
    keys += ("per_prompt_accepted", "per_prompt_verifications")
    points = []
    for i, seed in enumerate(args.eval_seeds):
        temps = [t for t in args.temperature if t > 0 or i == 0]  # greedy does not depend on the seed
        if not temps:
            continue
        over = [
            f"eval.num_prompts={args.num_prompts}",
            f"eval.seed={seed}",
            *eval_dtype_overrides(args.eval_dtype),
        ]
        recipe = load_recipe(args.recipe, [*args.overrides, *budget(args), *over])
        report = run_eval(
            recipe,
            out,
            drafts=drafts,
            ks=args.k,
            trees=[],
            temperatures=temps,
            concurrency=[args.concurrency],
            progress=True,
            force=True,
            split=args.split,
        )
        points += [
            {**{k: r[k] for k in keys}, "split": args.split, "eval_seed": seed}
            for r in report["results"]
            if r.get("k") is not None
        ]
    return points


def pooled(rows: list[dict]) -> float:
    """tau over every prompt of `rows`: accepted-and-bonus tokens over target forwards."""
    forwards = sum(r["target_forwards"] for r in rows)
    return sum(r["acceptance_length"] * r["target_forwards"] for r in rows) / max(forwards, 1)


def family(draft: str) -> str:
    """ "eyas-s1" -> "eyas": the drafts of one trainer (or one extra --draft NAME-sS) over seeds."""
    return draft.rsplit("-s", 1)[0]


def runs(points: list[dict], fam: str, temp: float, k: int) -> list[list[dict]]:
    """A trainer's loop runs at (temp, k): one per (draft, eval seed), each its rows over the benchmarks."""
    at = [p for p in points if p["temperature"] == temp and p["k"] == k and family(p["draft"]) == fam]
    keys = dict.fromkeys((p["draft"], p.get("eval_seed", 0)) for p in at)
    return [[p for p in at if (p["draft"], p.get("eval_seed", 0)) == key] for key in keys]


def cell_draws(cell: list[list[dict]], idx: np.ndarray) -> np.ndarray:
    """The mean over a cell's runs of tau over each draw of prompts (the same prompts in every run, each
    run's benchmarks one after another): idx (draws, prompts) -> (draws,)."""
    taus = []
    for run in cell:
        acc = np.concatenate([np.asarray(r["per_prompt_accepted"], dtype=np.float64) for r in run])
        rounds = np.concatenate([np.asarray(r["per_prompt_verifications"], dtype=np.float64) for r in run])
        taus.append(tau_draws(acc, rounds, idx))
    return np.mean(taus, axis=0)


def prompts_of(cell: list[list[dict]]) -> int:
    return sum(len(r["per_prompt_accepted"]) for r in cell[0])


def table(args, points: list[dict], trained: list[dict]) -> list[str]:
    """Per trainer at every (temperature, k): pooled tau, the mean over its drafts (seeds) and eval seeds,
    with its 95% bootstrap interval over the prompts (the same prompts drawn for every run: at T > 0 it holds
    the sampling's noise too), then each seed's; and every other trainer's lead over the first, paired, with
    its interval: a lead is claimed only where the interval excludes 0."""
    lines, fams = [], list(dict.fromkeys(family(p["draft"]) for p in points))
    for temp in args.temperature:
        seeds = len(args.eval_seeds) if temp > 0 else 1
        lines += [
            "",
            f"T={temp:g}: tau over all prompts, mean over seeds x {seeds} eval seed(s) [95% interval]",
        ]
        lines.append(f"{'trainer':<16}" + "".join(f"{f'k={k}':>34}" for k in args.k) + f"{'train tok/s':>13}")
        for fam in fams:
            cells = ""
            for k in args.k:
                cell = runs(points, fam, temp, k)
                lo, hi = bootstrap_interval(lambda idx: cell_draws(cell, idx), prompts_of(cell)) or (0, 0)
                each = "/".join(f"{pooled(r):.2f}" for r in cell)
                cells += f"{np.mean([pooled(r) for r in cell]):>8.3f} [{lo:.3f}-{hi:.3f}] ({each})"
            rates = [t["tokens_per_s"] for t in trained if t["trainer"] == fam]
            lines.append(f"{fam:<16}{cells}" + (f"{sum(rates) / len(rates):>13.0f}" if rates else ""))
        for fam in fams[1:]:
            gaps = ""
            for k in args.k:
                a, b = runs(points, fams[0], temp, k), runs(points, fam, temp, k)
                lo, hi = bootstrap_interval(
                    lambda idx: cell_draws(a, idx) - cell_draws(b, idx), prompts_of(a)
                )
                gap = np.mean([pooled(r) for r in a]) - np.mean([pooled(r) for r in b])
                gaps += f"{gap:>+8.3f} [{lo:+.3f} {hi:+.3f}]" + " " * 11
            lines.append(f"{fams[0] + ' - ' + fam:<16}{gaps}")
    return lines


def lr_sweep(p: argparse.ArgumentParser, given: list[str], split: str) -> dict[str, list[float | None]]:
    """--lr TRAINER=LR[,LR...] -> {trainer: its lrs} (None: its own default); a sweep (several lrs) chooses,
    so it is refused off the tuning split."""
    lrs: dict[str, list[float | None]] = {t: [None] for t in TRAINERS}
    for item in given:
        trainer, _, values = item.partition("=")
        if trainer not in TRAINERS or not values:
            p.error(f"--lr {item}: expected TRAINER=LR[,LR...] with TRAINER one of {', '.join(TRAINERS)}")
        try:
            lrs[trainer] = [float(v) for v in values.split(",")]
        except ValueError:
            p.error(f"--lr {item}: {values!r} is not a list of numbers")
    swept = [t for t, v in lrs.items() if len(v) > 1]
    if swept and split not in TUNE_ON:
        p.error(
            f"--split {split}: --lr sweeps {', '.join(swept)} on prompts nothing may be tuned on; sweep on "
            f"--split tuning, then measure each trainer's best lr with --split {split}"
        )
    return lrs


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a finished eyas run (its capture and vocab)")
    p.add_argument("--recipe", default=None, help="default RUN/recipe.yaml")
    p.add_argument("--work", type=Path, default=Path(os.environ.get("PEER_WORK", "peer-work")))
    p.add_argument("--peer", type=Path, default=Path("../shared/peer"), help="the peers' launchers")
    p.add_argument("--peer-python", type=Path, default=None, help="default WORK/venv/bin/python")
    p.add_argument(
        "--target-dir", type=Path, default=None, help="the peers' target (WORK/smollm2-135m-instruct)"
    )
    p.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    p.add_argument("--name", default="eyas", help="eyas's drafts: WORK/NAME-sS (a name for other overrides)")
    p.add_argument(
        "--lr",
        action="append",
        default=[],
        metavar="TRAINER=LR[,LR...]",
        help="the trainer's lr (repeatable; default its own: eyas its recipe's, speculators 1e-3, SpecForge "
        "1e-4); several are a sweep, one draft per lr and seed, allowed on --split tuning only",
    )
    p.add_argument(
        "--split",
        required=True,
        choices=("tuning", "test"),
        help="the loop's prompts (data/splits.py): tuning, the held-out training conversations, where lrs "
        "and settings are chosen; test, the recipe's eval prompts, which only measure what tuning chose",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--ttt", type=int, default=5, help="TTT steps (P-EAGLE: depths) of every trainer")
    p.add_argument(
        "--kind",
        choices=("eagle3", "peagle", "dflash"),
        default="eagle3",
        help="the draft kind every trainer trains (peagle, dflash: eyas and speculators; SpecForge 0.2.0 has "
        "neither)",
    )
    p.add_argument(
        "--anchors", type=int, default=512, help="--kind dflash: blocks per packed row (speculators' default)"
    )
    p.add_argument("--max-length", type=int, default=1024, help="the longest sequence scored, and trained on")
    p.add_argument(
        "--speculators-rows",
        type=int,
        default=None,
        help="speculators' packed row length (--total-seq-len), default --max-length; eyas's is its "
        "train.max_length (override it after --)",
    )
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument(
        "--eval-seeds",
        type=int,
        nargs="+",
        default=[0],
        help="eval.seed of each T > 0 evaluation (request i samples with seed + i): the sampling's noise "
        "averaged over them (every draft runs with the same seeds, so its noise is shared by all)",
    )
    p.add_argument("--num-prompts", type=int, default=8, help="per benchmark of the recipe's eval.benchmarks")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--no-eval", action="store_true", help="train (and import) only")
    p.add_argument(
        "--no-scores",
        action="store_true",
        help="skip scoring on the tuning split's captured sequences (a second --temperature run: the first "
        "one's rows are in WORK/results.jsonl)",
    )
    p.add_argument(
        "--probe",
        type=int,
        default=None,
        metavar="N",
        help="also score every draft as on the held-out sequences on the target's greedy answers to the "
        "loop's prompts (N per benchmark: the loop's own when N is --num-prompts), captured once",
    )
    p.add_argument("--eval-dtype", default="bfloat16", help="the target's dtype in the loop (the capture's)")
    p.add_argument(
        "--draft", action="append", default=[], help="NAME=CHECKPOINT: another eyas draft to evaluate"
    )
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value): eyas's training and eval")
    args = p.parse_args(argv)
    shared = {"train.epochs": "--epochs", "train.ttt_steps": "--ttt", "draft.kind": "--kind"}
    for o in args.overrides:  # the shared budget would replace them silently
        if o.split("=", 1)[0] in shared:
            p.error(f"{o}: every trainer's budget; set it with {shared[o.split('=', 1)[0]]}")
    args.lr = lr_sweep(p, args.lr, args.split)
    if args.kind != "eagle3" and "specforge" in args.trainers:
        p.error(
            f"--kind {args.kind}: SpecForge 0.2.0 (the peers' venv) trains no {args.kind}; --trainers eyas "
            "speculators"
        )
    if args.probe and args.split == "tuning":
        p.error(
            "--probe answers the test split's prompts; on --split tuning the held-out sequences already "
            "are the tuning prompts' greedy answers"
        )
    args.speculators_rows = args.speculators_rows or args.max_length
    args.recipe = args.recipe or str(args.run / "recipe.yaml")
    args.peer_python = args.peer_python or args.work / "venv" / "bin" / "python"
    args.target_dir = args.target_dir or args.work / "smollm2-135m-instruct"
    return args


CONVERTERS = {
    "speculators": ("convert_speculators.py", "generic"),
    "specforge": ("convert_specforge.py", "generic-train"),
}


def prepare_data(args, recipe) -> dict:
    """The peers' target directory, the generic export and each peer's converted data -> the export's meta."""
    if not (args.target_dir / "model.safetensors").is_file():
        peer(
            args,
            "make_smollm2.py",
            "--out",
            str(args.target_dir),
            log=args.work / "logs" / "make_smollm2.log",
        )
    meta = {"val_seed": split_seed(recipe.train), **export_generic(args.run, recipe, args.work / "generic")}
    for flag, n in (("--max-length", args.max_length), ("--speculators-rows", args.speculators_rows)):
        if meta["max_length"] > n:
            raise SystemExit(f"{flag} {n}: the capture holds a sequence of {meta['max_length']}")
    for trainer, (script, src) in CONVERTERS.items():
        out = args.work / "data" / trainer
        if trainer in args.trainers and not out.is_dir():
            src_dir, log = str(args.work / src), args.work / "logs" / f"convert-{trainer}.log"
            peer(
                args,
                script,
                "--capture",
                src_dir,
                "--out",
                str(out),
                "--target",
                str(args.target_dir),
                log=log,
            )
    return meta


def main(argv=None) -> int:
    args = parse(argv)
    recipe = load_recipe(args.recipe, [*args.overrides, *budget(args)])  # the kind's own keys need its kind
    meta = prepare_data(args, recipe)
    trained = []
    with open(args.work / "results.jsonl", "a") as results:
        for trainer, lr, seed in [(t, lr, s) for t in args.trainers for lr in args.lr[t] for s in args.seeds]:
            rec = TRAIN[trainer](args, meta, seed, lr)
            tokens = args.epochs * meta["train_tokens"]
            name = trainer_name(args, trainer, lr)
            row = {"trainer": name, "seed": seed, "epochs": args.epochs, "ttt": args.ttt, "lr": lr}
            row["draft_kind"] = args.kind
            row.update(tokens_seen=tokens, wall_s=rec["wall_s"], tokens_per_s=tokens / rec["wall_s"])
            trained.append({**row, "kind": trainer, "checkpoint": rec["checkpoint"]})
            print(json.dumps(row), file=results, flush=True)
            print(json.dumps(row), flush=True)
        names = [f"{t['trainer']}-s{t['seed']}" for t in trained]
        drafts = [
            (name, imported(args, name, t["kind"], t["checkpoint"], recipe.target.model))
            for name, t in zip(names, trained)
        ]
        for name, ckpt in drafts:
            exported(args, name, ckpt)
        drafts += [tuple(d.split("=", 1)) for d in args.draft]
        held = [] if args.no_scores else held_out_tau(args, recipe, drafts)
        probed = probe_tau(args, recipe, drafts) if args.probe else []
        for row in held + probed:
            print(json.dumps(row), file=results, flush=True)
        tables = (held_out_table(held) if held else []) + (held_out_table(probed) if probed else [])
        if args.no_eval:
            print("\n".join(tables))
            return 0
        points = evaluate(args, drafts)
        for point in points:
            print(json.dumps(point), file=results, flush=True)
    print("\n".join(tables + table(args, points, trained)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
