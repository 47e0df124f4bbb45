"""One GPU check, ready to run on one H100 / H200 with no network and no vLLM (torch, transformers and
accelerate only):

    python benchmarks/gpu_check.py [--out runs/gpu-check] [--only tests ttt target pipeline long]

Sections, each in a process of its own under a time limit (LIMITS: 9 minutes in all at most; not yet run on a
GPU), then one table:

    tests      the `gpu` tests (python -m pytest -m gpu tests)
    ttt        a TTT training step at gpt-oss-120b's draft dims (recipes/gpt-oss-120b.yaml: 215.5M trainable,
               TTT 5, bf16 autocast), T = 4K and 32K: seconds per step, tokens/s, peak GPU memory against
               `eyas plan`'s training memory per GPU at that length (benchmarks/bench_ttt_step.py); then
               the same for P-EAGLE's COD step (one layer, 8 depths, COD 0.7 / 0.2: gpt-oss-120b-peagle)
               and DFlash's block step (8 layers, block 10, 512 anchors: gpt-oss-120b-dflash)
    target     the full-width target at gpt-oss-20b's depth: gpt-oss-120b's widths with 24 layers of 32
               experts, random weights stored as the hub stores them (MXFP4 experts:
               data/demo_target/full_width.py)
    pipeline   that target through prompts, regeneration, capture, vocab, training and eval with the HF
               backends on the GPU (recipes/gpt-oss-120b.yaml cut to a few prompts and steps), each stage in
               its own process: wall seconds and peak GPU memory against `eyas plan`'s for that stage
    long       the serving loop on that target with a random draft at gpt-oss-120b's draft dims, one prompt of
               32K and one of 128K tokens (131,040: the context less the answer's room) (chunked prefill,
               blocked attention: train/blocked_attention.py): peak GPU memory above the weights against
               `eyas plan`'s KV + activations for that request, and at 32K the loop's output against the
               greedy reference

`--smoke` runs every section small on this machine's CPU (4 layers of 4 experts, T = 256, prompts of 1K and 2K
tokens): the script's own check, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the device machine reaches no network: every hub lookup (a plan's sample of a hub dataset) fails at once
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# seconds per section: 9 minutes in all at most (the pipeline's stages share theirs)
LIMITS = {"tests": 60, "ttt": 120, "target": 90, "pipeline": 150, "long": 120}
STAGES = ("prompts", "regenerate", "capture", "vocab", "train", "eval")


def scale(smoke: bool) -> dict:
    """The sizes of each section: the GPU's, or --smoke's on a CPU."""
    if smoke:
        return {"device": "cpu", "layers": 4, "experts": 4, "ttt": [256], "long": [1024, 2048], "prompts": 8,
                "steps": 1, "row": 64, "aux": "[2,3,4]"}  # fmt: skip
    return {
        "device": "cuda",
        "layers": 24,
        "experts": 32,
        "ttt": [4096, 32768],
        "long": [32768, 131072 - 32],  # the full-width target's context is 131,072: room for the answer
        "prompts": 16,
        "steps": 4,
        "row": 512,
        "aux": "null",  # [2, N//2, N-3] = [2, 12, 21] (vLLM ids)
    }


def peak_bytes(device: str) -> int:
    """The peak memory since the last reset_peak: CUDA's allocator, else this process's peak RSS."""
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024


def reset_peak(device: str) -> int:
    """Reset the peak; -> the bytes held now (the baseline a peak is measured above)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak_bytes(device)


def emit(**row) -> None:
    print("RESULT " + json.dumps(row), flush=True)


# ---------------------------------------------------------------- sections (each in its own process)


def section_tests(a, s) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            str(HERE.parent / "tests"),
        ],
        capture_output=True,
        text=True,
    )
    last = [x for x in r.stdout.splitlines() if x.strip()][-1:] or ["(no output)"]
    failed = [x.split("::", 1)[1] for x in r.stdout.splitlines() if x.startswith("FAILED")]
    emit(section="tests", what="gpu tests", result=last[0], failed=failed, ok=r.returncode in (0, 5))


def section_ttt(a, s) -> None:
    from eyas.plan.command import plan
    from eyas.recipes.load import load_recipe

    # EAGLE-3's TTT (5 steps, recipes/gpt-oss-120b.yaml) and P-EAGLE's COD (8 depths, 0.7 / 0.2,
    # recipes/gpt-oss-120b-peagle.yaml's one-layer vLLM 0.32 variant), each against its recipe's plan
    # and DFlash's blocks (the gpt-oss-120b-dflash recipe's 8 layers, block 10, 512 anchors)
    kinds = (
        ("TTT", "eagle3", "gpt-oss-120b", 5),
        ("COD", "peagle", "gpt-oss-120b-peagle", 8),
        ("DFlash", "dflash", "gpt-oss-120b-dflash", 9),
    )
    for (label, kind, name, steps), T in [(k, T) for k in kinds for T in s["ttt"]]:
        size = "gpt-oss-120b-dflash" if kind == "dflash" else "gpt-oss-120b"
        cmd = [sys.executable, str(HERE / "bench_ttt_step.py"), "--size", size, "--device", s["device"]]
        cmd += ["--lengths", str(T), "--ttt-steps", str(steps), "--repeat", "2", "--kind", kind]
        r = subprocess.run(cmd, capture_output=True, text=True)
        m = re.search(r"([\d.]+) s/step\s+(\d+) tok/s\s+peak \w+\s+(\d+) MiB", r.stdout)
        over = [f"train.max_length={T}", f"train.ttt_steps={steps}", "train.pack=false"]
        over += [] if kind == "dflash" else ["draft.num_layers=1"]
        planned = plan(load_recipe(name, over), "1xH200").train_gb_per_gpu
        if not m:
            emit(section="ttt", what=f"{label} step T={T}", ok=False, error=(r.stdout + r.stderr)[-400:])
            continue
        sec, tok_s, mib = float(m.group(1)), int(m.group(2)), int(m.group(3))
        emit(
            section="ttt",
            what=f"{label} step T={T}",
            ok=True,
            seconds=sec,
            tok_s=tok_s,
            peak_gb=mib * 2**20 / 1e9,
            planned_gb=planned,
        )


def section_target(a, s) -> None:
    from eyas.data.demo_target.full_width import ensure_full_width_target

    t0 = time.time()
    path = ensure_full_width_target(layers=s["layers"], experts=s["experts"])
    size = sum(f.stat().st_size for f in path.iterdir()) / 1e9
    emit(
        section="target",
        what=f"build {s['layers']} layers x {s['experts']} experts",
        ok=True,
        seconds=time.time() - t0,
        note=f"{size:.1f} GB at {path}",
    )


def pipeline_recipe(s, out: Path):
    """recipes/gpt-oss-120b.yaml on the full-width target at this depth, cut to a few prompts and steps."""
    from eyas.data.demo_target.full_width import RUN_OVERRIDES, ensure_full_width_target
    from eyas.recipes.load import load_recipe

    path = ensure_full_width_target(layers=s["layers"], experts=s["experts"])
    keep = [o for o in RUN_OVERRIDES if not o.startswith(("target.", "capture.aux_layer_ids", "data.num_"))]
    over = [
        *keep,
        f"target.model={path}",
        f"target.device={s['device']}",
        "target.device_map=null",
        f"capture.aux_layer_ids={s['aux']}",
        f"data.num_prompts={s['prompts']}",
        f"data.num_eval_prompts={s['prompts'] // 4}",
        "data.backend=hf",
        "capture.backend=hf",
        f"train.max_steps={s['steps']}",
        f"train.max_length={s['row']}",
    ]
    return load_recipe("gpt-oss-120b", over)


def section_stage(a, s) -> None:
    """One pipeline stage in this process (the parent runs them in order): its seconds and peak memory."""
    import torch

    from eyas.infra.stages import stage_fn
    from eyas.pipeline import check_target, prepare_run
    from eyas.plan.command import plan

    run = Path(a.out) / "run"
    recipe = pipeline_recipe(s, run)
    if a.stage == "prompts":
        check_target(recipe)
    prepare_run(recipe, run)
    base = reset_peak(s["device"])
    t0 = time.time()
    stage_fn(a.stage)(recipe, run, progress=False)
    seconds = time.time() - t0
    planned = plan(recipe, "1xH200").process_bytes.get(a.stage, 0.0)
    peak = peak_bytes(s["device"]) - (base if s["device"] == "cpu" else 0)  # CUDA: everything it held
    emit(
        section="pipeline",
        what=f"stage {a.stage}",
        ok=True,
        seconds=seconds,
        peak_gb=peak / 1e9,
        planned_gb=planned / 1e9 if planned else None,
    )
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def section_long(a, s) -> None:
    """The loop on long prompts (module docstring) on the pipeline's target, a random draft."""
    import torch

    sys.path.insert(0, str(HERE))
    from bench_long_prompt import loop, prompt_of, random_draft

    from eyas.data.target import load_recipe_target
    from eyas.plan.eval_memory import eval_memory
    from eyas.recipes.load import load_recipe
    from eyas.serve.decoding.reference import greedy_generate

    recipe = pipeline_recipe(s, Path(a.out) / "run")
    target, _ = load_recipe_target(recipe.target.model_copy(update={"dtype": "bfloat16"}))
    draft, _ = random_draft(target, torch.bfloat16, [f"capture.aux_layer_ids={s['aux']}"])
    loop(target, draft, prompt_of(64), 3, 2, 8192, 1 << 30)  # warm-up: first calls' buffers and workspaces
    greedy_generate(target, prompt_of(64), 2)
    for L in s["long"]:
        prompt = prompt_of(L)
        base = reset_peak(s["device"])
        t0 = time.time()
        out = loop(target, draft, prompt, 3, 16, 8192, 1 << 30)[0]
        seconds = time.time() - t0
        peak = peak_bytes(s["device"]) - base
        over = [
            f"data.max_prompt_tokens={L}",
            f"train.max_length={L}",
            "eval.max_new_tokens=16",
            "eval.concurrency=[1]",
            "eval.k=3",
            "eval.prefill_tokens=8192",
            "eval.attention_block_mb=1024",
        ]
        m = eval_memory(load_recipe(recipe.to_dict(), over), target.config, draft.config, 0.0, 2)
        row = dict(
            section="long",
            what=f"loop, {L:,}-token prompt",
            ok=True,
            seconds=seconds,
            peak_gb=peak / 1e9,
            planned_gb=(m.kv + m.activations) / 1e9,
        )
        if L == s["long"][0]:
            row["note"] = f"output == greedy reference: {out == greedy_generate(target, prompt, 16)[0]}"
        emit(**row)


SECTIONS = {"tests": section_tests, "ttt": section_ttt, "target": section_target, "long": section_long}


# ---------------------------------------------------------------- the parent


def run_section(name: str, a, limit: float, extra=()) -> list[dict]:
    cmd = [
        sys.executable,
        __file__,
        "--section",
        name,
        "--out",
        a.out,
        *(["--smoke"] if a.smoke else []),
        *extra,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rows = [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
        return rows + [
            dict(section=name, what=" ".join(extra) or name, ok=False, error=f"over {limit:.0f} s")
        ]
    rows = [json.loads(x[7:]) for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode:
        rows.append(dict(section=name, what=" ".join(extra) or name, ok=False, error=r.stderr[-600:]))
    return rows


def table(rows: list[dict]) -> str:
    def gb(x):
        return f"{x:.1f} GB" if isinstance(x, (int, float)) else "—"

    out = [
        "| section | what | ok | seconds | peak memory | eyas plan | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        note = r.get("note") or r.get("result") or ""
        if r.get("tok_s"):
            note = f"{r['tok_s']:,} tok/s"
        if r.get("failed"):
            note += " failed: " + ", ".join(r["failed"])
        if r.get("error"):
            note += " " + r["error"].strip().replace("\n", " ")[-300:]
        sec = f"{r['seconds']:.1f}" if isinstance(r.get("seconds"), (int, float)) else "—"
        out.append(
            f"| {r['section']} | {r['what']} | {'yes' if r.get('ok') else '**no**'} | {sec} | "
            f"{gb(r.get('peak_gb'))} | {gb(r.get('planned_gb'))} | {note} |"
        )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/gpu-check")
    p.add_argument("--only", nargs="+", choices=[*SECTIONS, "pipeline"], default=None)
    p.add_argument("--smoke", action="store_true", help="every section small, on this machine's CPU")
    p.add_argument("--section", help=argparse.SUPPRESS)
    p.add_argument("--stage", help=argparse.SUPPRESS)
    a = p.parse_args()
    s = scale(a.smoke)
    if a.section:
        (section_stage if a.section == "pipeline" else SECTIONS[a.section])(a, s)
        return 0
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    print(f"gpu check: torch {torch.__version__}, {gpu}")
    t0, rows, shown = time.time(), [], 0
    for name in a.only or ["tests", "ttt", "target", "pipeline", "long"]:
        if name == "pipeline":
            end = time.time() + LIMITS["pipeline"]
            for stage in STAGES:
                rows += run_section("pipeline", a, max(end - time.time(), 1), ["--stage", stage])
                if not rows[-1].get("ok"):
                    break
        else:
            rows += run_section(name, a, LIMITS[name])
        for r in rows[shown:]:
            print(r, flush=True)
        shown = len(rows)
    print(f"\n{table(rows)}\n\nwall {time.time() - t0:.0f} s")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
