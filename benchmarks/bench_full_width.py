"""Every stage at gpt-oss-120b's widths on this machine: the full-width target (`eyas-full-width`:
gpt-oss-120b's config but 2 layers and 4 MXFP4-stored experts) with recipes/gpt-oss-120b.yaml's draft, each
stage in its own process, its peak memory against `eyas plan`'s prediction for that process.

    python benchmarks/bench_full_width.py [--recipe NAME] [--out runs/bench-full-width] [key.sub=value ...]

--recipe gpt-oss-120b-peagle runs the P-EAGLE recipe's draft (4 layers, 8 depths, COD) the same way, and
--recipe gpt-oss-120b-dflash the DFlash recipe's (8 layers, block 10, z-lab's shape; pass
capture.aux_layer_ids=[0,1,2,3,4] for its five target states on this 4-layer target). A draft that vLLM 0.32
cannot serve on this target (its layers over more than one KV-cache group of the 2 sliding + 2 full layers:
serve/interchange/engines.py draft_kv_groups) is refused by `eyas export`; the table then says so and skips
export, publish and vLLM (`draft.num_layers=1` runs them).

Stages: prompts, regenerate, capture, vocab, train (offline), then online training on a copy (capture.mode
online: vLLM's producers where vLLM runs MXFP4 here, else the target in the training process), eval,
`eyas export` (the kind's layout), `eyas publish --dry-run`, and vLLM loading the target with the export and
decoding with it (on a CPU without AMX, where vLLM's CPU build has no MXFP4 kernel, a bf16 copy of the
target). Peak memory is each process's maximum resident set (GNU time's %M), less the interpreter's own (a
process that imports eyas's stages); the prediction is `eyas plan --gpus cpu`'s (eyas/plan/stage_memory.py:
the recipes here run every stage on the CPU, target.device cpu), less its interpreter's floor. Prints the
table, the capture's bytes per token and the draft's parameters, both exact against `eyas plan`'s
gpt-oss-120b figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EYAS = [sys.executable, "-m", "eyas"]
BASELINE = "import eyas.train.trainer, eyas.eval.evaluate, eyas.data.capture, eyas.data.regenerate"


def measured(cmd: list[str], check: bool = True) -> tuple[float, float] | None:
    """Run `cmd` under GNU time; -> (seconds, its peak resident bytes). A failure stops the benchmark, or
    with check=False returns None (its `eyas: error:` line is on stderr). (Not os.wait4 on a child of this
    process: Linux counts in a child's peak the memory of the process it was forked from.)"""
    t0 = time.time()
    with tempfile.NamedTemporaryFile("r") as peak:
        if subprocess.run(["/usr/bin/time", "-f", "%M", "-o", peak.name, *cmd]).returncode != 0:
            if not check:
                return None
            raise SystemExit(f"{' '.join(cmd)} failed")
        return time.time() - t0, int(peak.read().split()[-1]) * 1024


def predictions(recipe, run: Path) -> dict[str, float]:
    """eyas plan's memory of each stage on this machine (eyas/plan/stage_memory.py, as `--gpus cpu`), above
    the interpreter's floor as the table's measured column is, for what `run` regenerated."""
    from eyas.data.regenerate import read_sequences
    from eyas.data.target import count_target
    from eyas.plan.cost import Assumptions, count_draft, target_config
    from eyas.plan.stage_memory import stage_memory

    cfg, _ = target_config(recipe)
    lengths = [len(s["input_ids"]) for s in read_sequences(run)]
    a, draft = Assumptions(), count_draft(recipe, cfg)
    mem = stage_memory(recipe, cfg, count_target(cfg), draft, a, True, sum(lengths), max(lengths))
    return {k: v - a.cpu_process_bytes if v else v for k, v in mem.process.items()}


def vllm_loads(run: Path, export: Path, out: Path) -> dict:
    """vLLM with the target and the export, greedy, 8 tokens on 2 prompts -> what it reported."""
    from eyas.data.regenerate import read_sequences
    from eyas.data.target import resolve_path
    from eyas.infra.vllm.vllm_env import mxfp4_runs_here
    from eyas.infra.vllm.vllm_jobs import run_offline
    from eyas.train.kinds import speculative_config

    target = resolve_path("eyas-full-width")
    if not mxfp4_runs_here():
        target = bf16_copy(Path(target), out / "target-bf16")
    prompts = [s["input_ids"][: s["prompt_len"]] for s in read_sequences(run)[:2]]
    spec = speculative_config(export, 2)  # a P-EAGLE export: parallel_drafting; DFlash: method dflash
    res = run_offline(
        target,
        [{"name": "draft", "speculative_config": spec}],
        prompts,
        {"temperature": 0.0, "max_tokens": 8},
        dtype="bfloat16",
        max_model_len=512,
        log_path=out / "vllm.log",
    )["draft"]
    if "error" in res:
        raise SystemExit(f"vLLM refused the export: {res['error']}")
    return {
        "target": str(target),
        "outputs": res["outputs"],
        "counters": res["counters"],
        "init_s": res["init_s"],
    }


def bf16_copy(src: Path, dst: Path) -> str:
    """The target with its experts dequantized to bf16 and no quantization_config (what vLLM's CPU build can
    run without AMX), written once."""
    if (dst / "config.json").is_file():
        return str(dst)
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(dst / "model.safetensors"))
    cfg = AutoConfig.from_pretrained(src).to_dict()
    cfg.pop("quantization_config", None)
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(f, dst / f.name)
    return str(dst)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="gpt-oss-120b", help="a shipped gpt-oss-120b recipe")
    p.add_argument("--out", default="runs/bench-full-width")
    p.add_argument("overrides", nargs="*", help="recipe overrides (key.sub=value)")
    args = p.parse_args(argv)
    from eyas.data.demo_target.full_width import ensure_full_width_target, full_width_config, run_overrides
    from eyas.infra.layout import read_done
    from eyas.plan.command import plan
    from eyas.recipes.load import load_recipe
    from eyas.serve.interchange.engines import draft_kv_groups
    from eyas.train.kinds import kind_named

    ensure_full_width_target()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    run, over = out / "run", run_overrides() + args.overrides
    recipe = load_recipe(args.recipe, over)
    base = measured([sys.executable, "-c", BASELINE])[1]
    rows = {"prompts": measured([*EYAS, "prompts", args.recipe, "--out", str(run), *over])}
    for stage in ("regenerate", "capture", "vocab", "train", "eval"):
        rows[stage] = measured([*EYAS, stage, str(run), "--no-progress"])
    online = out / "online"
    shutil.copytree(
        run, online, ignore=shutil.ignore_patterns("capture", "vocab", "train", "eval*", "report*")
    )
    more = ["capture.mode=online"] + (["vllm.devices=[0]"] if "capture.backend=vllm" in over else [])
    for stage in ("capture", "vocab", "train"):
        rows[f"online {stage}"] = measured([*EYAS, stage, str(online), "--no-progress", *more])
    export, fmt = out / "export", kind_named(recipe.draft.kind).formats[0]
    rows["export"] = measured([*EYAS, "export", str(run), "--format", fmt, "--out", str(export)], False)
    # the one refusal expected: draft layers over more than one of vLLM's KV-cache groups on the target's
    # sliding + full attention (engines.py draft_kv_groups)
    types = full_width_config().layer_types
    if (rows["export"] is None) != (draft_kv_groups(types, recipe.draft.num_layers) > 1):
        raise SystemExit(f"export {'failed' if rows['export'] is None else 'passed'}, which it should not")
    vllm = None
    if rows["export"]:
        publish = [*EYAS, "publish", str(run), "--repo", "someone/draft", "--dry-run"]
        rows["publish --dry-run"] = measured([*publish, "--out", str(out / "publish")])
        vllm = vllm_loads(run, export, out)
    predicted = predictions(recipe, run) | {
        "online train": predictions(load_recipe(args.recipe, over + more), run)["train"]
    }
    print(f"\ninterpreter with eyas's stages imported: {base / 1e9:.2f} GB")
    print("| stage | wall s | peak GB | above the interpreter GB | eyas plan GB | ratio |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        if row is None:
            print(f"| {name} | refused (its `eyas: error` above): publish and vLLM skipped | | | | |")
            continue
        secs, peak = row
        pred = predicted.get(name)
        ratio = f"{(peak - base) / pred:.2f}" if pred else "—"
        shown = f"{pred / 1e9:.2f}" if pred else "—"
        print(f"| {name} | {secs:.0f} | {peak / 1e9:.2f} | {(peak - base) / 1e9:.2f} | {shown} | {ratio} |")
    p120 = plan(load_recipe(args.recipe, args.overrides), "8xH100")  # gpt-oss-120b itself, the draft as run
    index = json.loads((run / "capture" / "index.json").read_text())
    trained = read_done(run, "train")["trainable_parameters"]
    print(
        f"capture: {index['bytes_per_token']:.1f} bytes/token stored (eyas plan, {args.recipe}: "
        f"{p120.capture_bytes_per_token:,}); draft: {trained:,} trainable "
        f"(eyas plan: {p120.draft_trainable:,})"
    )
    if vllm:
        print(
            f"vLLM: {vllm['target']} with the {fmt} export loaded in {vllm['init_s']} s; outputs "
            f"{vllm['outputs']}; spec-decode counters {vllm['counters']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
