"""The built-in serving loop at operating points: tau, output tokens/s and speedup per concurrency x
k / tree x temperature, and the loop's own overhead.

    python benchmarks/bench_serving.py runs/demo                       # the demo run (its target + draft)
    python benchmarks/bench_serving.py runs/demo --device cuda
    python benchmarks/bench_serving.py --random-target gpt-oss-20b --device cuda --concurrency 1 16 64 \\
        --k 3 --temperature 0 --overhead-only                          # random weights, gpt-oss-20b shape

Loop overhead = median time of one decoding iteration of the engine (draft tree, masks, the target's
verification forward, acceptance, cache rollback, the draft's step 0, bookkeeping) / median time of
one plain Hugging Face forward of the target over the same tokens (B rows x N new tokens against a
DynamicCache already holding the same context length). Plain decoding (k=0) gives the overhead of
the engine alone (N=1). Everything runs in one process, one configuration after the other.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eyas.data.chat import eos_token_ids, render_prompt
from eyas.data.target import input_device, load_recipe_target
from eyas.eval.benchmarks import held_out
from eyas.eval.load import LoadResult, acceptance, run_engine
from eyas.infra import layout
from eyas.recipes.load import load_recipe
from eyas.recipes.types import TreeShape
from eyas.serve.decoding.engine import Engine
from eyas.serve.decoding.sampling import SamplingParams
from eyas.train.checkpoint import load_draft_beside
from eyas.train.kinds import default_k, kind_of


@dataclass
class Setup:
    """What the benchmark serves: a target and its draft, the target's eos ids, the prompts (token
    ids) and a line saying what they are."""

    model: torch.nn.Module
    draft: torch.nn.Module
    eos: set[int]
    prompts: list[list[int]]
    what: str
    device: torch.device


def random_target(name: str, layers: int | None, device: str, dtype: torch.dtype):
    """A random-weight GptOssForCausalLM with the named shape (built directly on the device)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    shapes = {
        "gpt-oss-20b": dict(num_hidden_layers=24, num_local_experts=32),
        "gpt-oss-120b": dict(num_hidden_layers=36, num_local_experts=128),
    }
    cfg = GptOssConfig(
        **{**shapes[name], **({"num_hidden_layers": layers} if layers else {})},
        hidden_size=2880,
        intermediate_size=2880,
        head_dim=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=201088,
        sliding_window=128,
        num_experts_per_tok=4,
        max_position_embeddings=131072,
    )
    with torch.device(device):
        model = GptOssForCausalLM(cfg).to(dtype).eval()
    return model


def bare_forward_s(model, rows: int, tokens: int, context: int, repeats: int = 5) -> float:
    """Median seconds of model(B x N new tokens) against a DynamicCache holding `context` tokens."""
    from transformers import DynamicCache

    dev = input_device(model)  # where the embedding runs, offloaded or not
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, V, (rows, max(context, 1)), generator=g).to(dev)
    new = torch.randint(0, V, (rows, tokens), generator=g).to(dev)
    times = []
    with torch.no_grad():
        prefilled = DynamicCache(config=model.config)
        model(input_ids=ctx, past_key_values=prefilled, use_cache=True, logits_to_keep=1)
        for _ in range(repeats + 1):
            cache = copy.deepcopy(prefilled)  # (no crop: DynamicCache cannot roll sliding layers back)
            _sync(dev)
            t0 = time.perf_counter()
            model(input_ids=new, past_key_values=cache, use_cache=True)
            _sync(dev)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def decode_median(stats) -> tuple[float, int, int, int]:
    """-> (median iteration seconds, typical rows, tokens per row, mean context) over decode steps."""
    dec = [s for s in stats if s.kind == "decode"]
    rows = statistics.median_low([s.rows for s in dec])
    same = [s for s in dec if s.rows == rows] or dec
    return (
        statistics.median(s.total_s for s in same),
        rows,
        same[0].tokens_per_row,
        int(statistics.mean(s.context for s in same)),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", help="an eyas run directory (target, draft, held-out prompts)")
    p.add_argument("--random-target", choices=["gpt-oss-20b", "gpt-oss-120b"])
    p.add_argument("--layers", type=int, help="override the random target's layer count (smoke runs)")
    p.add_argument("--device", default=None)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument(
        "--k",
        type=int,
        nargs="+",
        default=None,
        help="chain lengths (default: 1-4 where the draft trained them, else the trained k nearest 3)",
    )
    p.add_argument("--tree", nargs="*", default=["3,2,6"])
    p.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--prompts", type=int, default=32, help="prompts per configuration")
    p.add_argument("--prompt-len", type=int, default=512, help="random-target prompt length")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--overhead-only", action="store_true", help="skip the throughput table (random targets)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", help="also write the rows here")
    return p.parse_args(argv)


def random_setup(args: argparse.Namespace) -> Setup:
    """A random-weight target of the named shape, a random draft for it (tests/tiny_targets.py) and
    random prompts of --prompt-len tokens."""
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = random_target(args.random_target, args.layers, dev, torch.bfloat16)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_targets import draft_for

    n = model.config.num_hidden_layers
    aux_ids = [2, n // 2, n - 3] if n >= 6 else [0, 1, n - 1]
    draft = draft_for(model, 0, aux_ids=aux_ids).to(dev, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, model.config.vocab_size, (args.prompt_len,), generator=g).tolist()
        for _ in range(args.prompts)
    ]
    what = f"random {args.random_target}" + (f" ({args.layers} layers)" if args.layers else "")
    return Setup(model, draft, set(), prompts, what, torch.device(dev))


def run_setup(args: argparse.Namespace) -> Setup:
    """An eyas run's target (its recipe, --device overriding target.device), final draft and held-out
    prompts rendered with the target's chat template."""
    run = Path(args.run)
    recipe = load_recipe(run / layout.RECIPE, [f"target.device={args.device}"] if args.device else [])
    model, tok = load_recipe_target(recipe.target)
    dev = input_device(model)  # a run whose target.device_map splits it: the loop runs on the input device
    draft = load_draft_beside(run / layout.FINAL_CHECKPOINT, model)
    prompts = [render_prompt(tok, m) for m in held_out(run, args.prompts).messages]
    return Setup(model, draft, set(eos_token_ids(model, tok)), prompts, f"{recipe.target.model} ({run})", dev)


def default_ks(cfg) -> list[int]:
    """k = 1 .. 4 where the draft of DraftConfig `cfg` trained that round (a DFlash draft trained on whole
    blocks serves its block's k only: DraftKind.untrained_k), else the trained k nearest 3."""
    ks = [k for k in range(1, 5) if kind_of(cfg).untrained_k(cfg.trained_k, k) is None]
    return ks or [default_k(cfg.kind, cfg.trained_k)]


def make_engine(setup: Setup, shape: TreeShape | None, concurrency: int) -> Engine:
    """The engine with the draft at `shape`, or plain decoding (shape None), profiling its steps."""
    draft = setup.draft if shape else None
    return Engine(setup.model, draft, shape, max_batch=concurrency, eos_ids=setup.eos, profile=True)


def measure_point(
    setup: Setup, shapes: list[TreeShape], temp: float, c: int, args: argparse.Namespace
) -> list[dict]:
    """Plain decoding, then each shape, at temperature `temp` holding `c` requests: a row each, printed
    as it is measured."""
    prompts = setup.prompts
    # random targets: 2C requests, so that C rows stay busy for most of the run
    n = 2 * c if args.overhead_only else len(prompts)
    ps = [prompts[i % len(prompts)] for i in range(n)]
    params = [SamplingParams(temperature=temp, seed=i, max_tokens=args.max_new_tokens) for i in range(n)]
    base = run_engine(make_engine(setup, None, c), ps, params, c)
    rows = [measured_row(setup.model, temp, c, "plain", 1.0, base, base)]
    _print(rows[-1], args.overhead_only)
    for shape in shapes:
        eng = make_engine(setup, shape, c)
        res = run_engine(eng, ps, params, c)
        eng.close()
        tau = acceptance(res.emitted, res.accepted, shape.steps)["acceptance_length"]
        rows.append(measured_row(setup.model, temp, c, shape.label, tau, res, base))
        _print(rows[-1], args.overhead_only)
    return rows


def measured_row(
    model: torch.nn.Module, temp: float, c: int, label: str, tau: float, res: LoadResult, base: LoadResult
) -> dict:
    """One table row: throughput against the plain run `base`, and the loop's overhead: its median
    decoding iteration against one bare forward of the target over the same rows, tokens and context."""
    it, B, N, L = decode_median(res.steps)
    bare = bare_forward_s(model, B, N, L)
    speedup = 1.0 if res is base else res.tokens_per_s / base.tokens_per_s
    return {
        "temperature": temp,
        "concurrency": c,
        "shape": label,
        "tau": tau,
        "tokens_per_s": res.tokens_per_s,
        "baseline_tokens_per_s": base.tokens_per_s,
        "speedup": speedup,
        "iteration_ms": it * 1e3,
        "bare_forward_ms": bare * 1e3,
        "overhead": it / bare,
        "rows": B,
        "tokens_per_row": N,
        "context": L,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    setup = random_setup(args) if args.random_target else run_setup(args)
    ks = args.k if args.k is not None else default_ks(setup.draft.config)
    shapes = [TreeShape.chain(k) for k in ks] + [TreeShape.parse(t) for t in args.tree]
    print(
        f"# {setup.what} on {setup.device}, {len(setup.prompts)} prompts, "
        f"max_new_tokens {args.max_new_tokens}, torch threads {torch.get_num_threads()}"
    )
    warm = [SamplingParams(temperature=0, max_tokens=4)]
    for shape in [None] + shapes:  # first-call costs out of the timings
        run_engine(make_engine(setup, shape, 1), setup.prompts[:1], warm, 1)
    if not args.overhead_only:
        print("\n| T | C | shape | τ | tok/s | baseline tok/s | speedup | ms/iter | loop overhead |")
        print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for temp in args.temperature:
        for c in args.concurrency:
            rows += measure_point(setup, shapes, temp, c, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def _print(r: dict, overhead_only: bool) -> None:
    if overhead_only:
        print(
            f"C={r['concurrency']:>3} {r['shape']:>14}  rows {r['rows']:>3} x {r['tokens_per_row']} "
            f"tokens, context {r['context']}: iteration {r['iteration_ms']:.2f} ms / bare forward "
            f"{r['bare_forward_ms']:.2f} ms = {r['overhead']:.2f}",
            flush=True,
        )
        return
    print(
        f"| {r['temperature']:g} | {r['concurrency']} | {r['shape']} | {r['tau']:.3f} "
        f"| {r['tokens_per_s']:.1f} | {r['baseline_tokens_per_s']:.1f} | {r['speedup']:.2f}× "
        f"| {r['iteration_ms']:.1f} | {r['overhead']:.2f} ({r['bare_forward_ms']:.1f} ms bare) |",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
