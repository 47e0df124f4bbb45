"""eyas's serving loop and the real vLLM, side by side: same target, same draft, same prompts.

    python benchmarks/bench_engines.py runs/demo                      # the demo run (eyas run demo)
    python benchmarks/bench_engines.py runs/demo --concurrency 1 4 16 --temperature 0 1 --k 3

For each temperature x concurrency: eyas's loop (in this process) and vLLM's OpenAI server (a
subprocess on 127.0.0.1 serving the run's draft exported for vLLM, fp32, driven over HTTP by
`eyas eval --server`'s client with the same number of requests in flight) answer the run's
held-out prompts. Printed per row: tau in one definition for both (vLLM's, 1 + accepted drafts /
verifications), tokens per forward, per-position acceptance, output tokens/s. Then regeneration
(`data.backend`) over the same prompts: HF generate in this process vs the server backend on a
plain vLLM server (no draft), tokens/s of generated tokens.

vLLM needs `eyas install-vllm` (or EYAS_VLLM_PYTHON). Both engines share the machine's cores: on
a 2-core CPU the numbers compare the two engines' CPU paths, not GPU serving.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from eyas.data.chat import render_prompt
from eyas.data.target import load_recipe_target, resolve_path
from eyas.eval.benchmarks import held_out
from eyas.eval.load import rates
from eyas.eval.server_client import run_server
from eyas.eval.side_by_side import eyas_loop
from eyas.infra.layout import RECIPE
from eyas.infra.vllm.vllm_server import VllmServer
from eyas.recipes.load import load_recipe
from eyas.serve.decoding.sampling import SamplingParams
from eyas.serve.interchange.export import export
from eyas.train.kinds import speculative_config


def loop_row(model, tok, draft_dir, prompts, sampling: dict, k: int, c: int) -> dict:
    res = eyas_loop(model, tok, draft_dir, prompts, sampling, k, concurrency=c)
    r = rates(res["counters"])
    tokens = sum(len(o) for o in res["outputs"])
    return {**r, "tok_s": tokens / res["wall_s"]}


def vllm_row(url: str, prompts, sampling: dict, c: int) -> dict:
    params = [SamplingParams(**{**sampling, "seed": i}) for i in range(len(prompts))]
    res, _, _, acc, _ = run_server(url, prompts, params, c)
    return {
        "tau": acc["acceptance_length"],
        "tokens_per_forward": acc["tokens_per_forward"],
        "per_position_acceptance": acc["per_position_acceptance"],
        "tok_s": res.tokens_per_s,
    }


def fmt(r: dict) -> str:
    pp = " / ".join(f"{a:.2f}" for a in r["per_position_acceptance"])
    return f"{r['tau']:.3f} | {r['tokens_per_forward']:.3f} | {pp} | {r['tok_s']:.1f}"


def data_rates(run: Path, url: str, n: int) -> dict[str, float]:
    """Tokens/s of the data stages over `n` prompts, HF in this process vs vLLM: regenerate (generated
    tokens; vLLM: the server backend on `url`) and capture (sequence tokens; vLLM: capture.backend)."""
    from eyas.data.capture import run_capture
    from eyas.data.prompts import run_prompts
    from eyas.data.regenerate import run_regenerate
    from eyas.infra.layout import read_done

    base = [
        "target.dtype=float32",
        "target.device=cpu",
        f"data.num_prompts={n + 2}",
        "data.num_eval_prompts=2",
    ]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, regen, cap in (
            ("HF", [], []),
            ("vLLM", ["data.backend=server", f"data.server_urls=[{url}/]"], ["capture.backend=vllm"]),
        ):
            d = Path(tmp) / name
            run_prompts(load_recipe(str(run / RECIPE), base), d, progress=False)
            run_regenerate(load_recipe(str(run / RECIPE), base + regen), d, progress=False)
            run_capture(load_recipe(str(run / RECIPE), base + regen + cap), d, progress=False)
            out[f"regenerate {name}"] = read_done(d, "regenerate")["generation_tokens_per_s"]
            out[f"capture {name}"] = read_done(d, "capture")["tokens_per_s"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished run (eyas run demo --out runs/demo)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args(argv)
    recipe = load_recipe(str(a.run / RECIPE), ["target.dtype=float32", "target.device=cpu"])
    model, tok = load_recipe_target(recipe.target)
    prompts = [render_prompt(tok, m) for m in held_out(a.run, a.num_prompts).messages]
    tmp = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    draft = export(a.run, "eagle3", tmp / "draft", dtype="float32", engines=["vllm"]).path
    target = resolve_path(recipe.target.model)
    print(
        f"# {len(prompts)} held-out prompts of {a.run}, k = {a.k}, max_tokens {a.max_tokens}, fp32, "
        f"{torch.get_num_threads()} threads\n"
    )
    print("| T | C | engine | τ | tokens / forward | per-position acceptance | output tok/s |")
    print("|---|---|---|---|---|---|---|")
    with VllmServer(target, speculative=speculative_config(draft, a.k), log_path=tmp / "vllm.log") as server:
        for t in a.temperature:
            sampling = {"temperature": t, "max_tokens": a.max_tokens, "seed": 0}
            for c in a.concurrency:
                for name, row in (
                    ("eyas", lambda: loop_row(model, tok, draft, prompts, sampling, a.k, c)),
                    ("vLLM", lambda: vllm_row(server.url, prompts, sampling, c)),
                ):
                    t0 = time.time()
                    print(f"| {t:g} | {c} | {name} | {fmt(row())} |  <!-- {time.time() - t0:.0f} s -->")
    with VllmServer(target, log_path=tmp / "vllm-plain.log") as plain:
        rates_ = data_rates(a.run, plain.url, a.num_prompts)
    print(
        f"\ndata stages over {a.num_prompts} prompts, fp32, tokens/s (regenerate: generated tokens, greedy, "
        "vLLM = the server backend on a plain vLLM server; capture: sequence tokens, vLLM = "
        "capture.backend: vllm)\n"
    )
    print("| stage | HF (transformers, in process) | vLLM |\n|---|---|---|")
    for stage in ("regenerate", "capture"):
        print(f"| {stage} | {rates_[f'{stage} HF']:.0f} | {rates_[f'{stage} vLLM']:.0f} |")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
