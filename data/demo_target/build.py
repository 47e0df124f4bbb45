"""Building, training and caching the demo target (`eyas demo-target`).

`ensure_demo_target()` returns a directory that every stage loads exactly as it would load
openai/gpt-oss-120b (`AutoModelForCausalLM.from_pretrained`, `AutoTokenizer.from_pretrained`):

    config.json, model.safetensors, generation_config.json   a trained GptOssForCausalLM
    tokenizer.json, tokenizer_config.json, chat_template.jinja   harmony format, eos <|return|>
    prompts.jsonl          held-out prompts (user turn only) for the later stages to answer
    eyas_demo_target.json  build parameters and metrics, written last: the build is complete

A build goes into a temporary sibling directory that is renamed into place at the end, so a
crash never leaves a half-written target. It takes about two minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from eyas.data.demo_target.corpus import generate_conversations, write_prompts
from eyas.data.demo_target.model import ARCHITECTURE, init_model
from eyas.data.demo_target.quality import measure
from eyas.data.demo_target.tokenizer import build_tokenizer, corpus_texts
from eyas.data.demo_target.training import encode, make_batches, train
from eyas.infra.cache import build_once, cache_root
from eyas.infra.io import write_json

VERSION = 2  # bump with any change that alters what a build produces (and the cache dir name)
CACHE_NAME = f"demo-target-v{VERSION}"
MARKER = "eyas_demo_target.json"

TRAIN_STEPS = 800
BATCH_SIZE = 16
LR = 5e-3
TOKENIZER_CONVERSATIONS = 4000
NUM_PROMPTS = 1500
EVAL_PROMPTS = 64
EVAL_MAX_NEW_TOKENS = 160
# float sums depend on the thread count, so the build runs on a fixed number of threads: the same
# target on every machine (with at least this many cores) and from any caller (a test that pins
# torch to one thread included)
BUILD_THREADS = 2


def default_cache_dir() -> Path:
    """`$EYAS_CACHE/demo-target-vN`, else `~/.cache/eyas/demo-target-vN` (N = VERSION)."""
    return cache_root() / CACHE_NAME


def _build_params(seed: int, steps: int) -> dict:
    return {
        "version": VERSION,
        "seed": seed,
        "steps": steps,
        "batch_size": BATCH_SIZE,
        "lr": LR,
        "architecture": ARCHITECTURE,
        "threads": BUILD_THREADS,
    }


def build_demo_target(
    out_dir: str | Path, seed: int = 0, steps: int = TRAIN_STEPS, progress: bool = True
) -> dict:
    """Build the demo target into `out_dir` (created; the marker file written last), on
    BUILD_THREADS threads. -> the marker's contents.

    The training conversations come from corpus seed 2*seed, the held-out prompts (and the
    quality measurement's references) from 2*seed + 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        return _build(Path(out_dir), seed, steps, progress)
    finally:
        torch.set_num_threads(threads)


def _build(out_dir: Path, seed: int, steps: int, progress: bool) -> dict:
    if steps < 1:
        raise ValueError(f"steps={steps}: the demo target needs at least one training step")
    t0 = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    train_seed, prompt_seed = 2 * seed, 2 * seed + 1
    records = generate_conversations(max(TOKENIZER_CONVERSATIONS, steps * BATCH_SIZE), train_seed)
    tokenizer = build_tokenizer(corpus_texts(records[:TOKENIZER_CONVERSATIONS]))

    examples = encode(tokenizer, records[: steps * BATCH_SIZE])
    model = init_model(tokenizer, seed)
    model.set_experts_implementation(
        "eager"
    )  # trains several times faster on CPU than the default grouped_mm
    training = train(
        model,
        make_batches(examples, BATCH_SIZE, tokenizer.pad_token_id, seed),
        LR,
        warmup=max(1, steps // 20),
        progress=progress,
    )

    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    write_prompts(out_dir / "prompts.jsonl", NUM_PROMPTS, prompt_seed)
    quality = measure(
        model, tokenizer, generate_conversations(EVAL_PROMPTS, prompt_seed), EVAL_MAX_NEW_TOKENS
    )

    info = {
        "build": _build_params(seed, steps),
        "model": {"vocab_size": len(tokenizer), "num_parameters": sum(p.numel() for p in model.parameters())},
        "tokens": {
            "mean_prompt": sum(p for _, p in examples) / len(examples),
            "mean_answer": sum(len(ids) - p for ids, p in examples) / len(examples),
        },
        "training": training,
        "quality": quality,
        "build_s": round(time.time() - t0, 1),
    }
    write_json(out_dir / MARKER, info)
    return info


def ensure_demo_target(
    cache_dir: str | Path | None = None,
    force: bool = False,
    seed: int = 0,
    progress: bool = True,
    steps: int | None = None,
) -> Path:
    """The demo target's directory (see the module docstring), built on first use (eyas/infra/cache.py: one
    build at a time per cache root, into a temporary directory renamed into place).

    A complete build made with the same `seed` and `steps` is returned at once unless `force`.
    `steps` overrides the number of training steps (default TRAIN_STEPS); a handful gives an
    untrained-looking but complete target in seconds, for tests."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    params = _build_params(seed, TRAIN_STEPS if steps is None else steps)

    def build(tmp: Path) -> None:
        build_demo_target(tmp, seed=seed, steps=params["steps"], progress=progress)

    if build_once(cache_dir, MARKER, params, build, force) and progress:
        _report(cache_dir, json.loads((cache_dir / MARKER).read_text()))
    return cache_dir


def _report(path: Path, info: dict) -> None:
    q, t = info["quality"], info["training"]
    print(
        f"demo target built in {info['build_s']:.0f} s at {path}\n"
        f"  training: {t['steps']} steps x {t['batch_size']} conversations, loss {t['first_loss']:.3f} -> "
        f"{t['final_loss']:.3f}\n"
        f"  greedy answers to {q['num_prompts']} held-out prompts: well-formed {q['well_formed']:.0%}, "
        f"correct {q['correct']:.0%}, mean next-token entropy {q['mean_entropy']:.3f} nats"
    )
    if q["well_formed"] < 0.9:
        print("  warning: fewer than 90% well-formed answers; the target is undertrained")


def main_demo_target(argv: list[str] | None = None) -> int:
    """`eyas demo-target`: build (or find) the demo target and print its directory."""
    ap = argparse.ArgumentParser(prog="eyas demo-target", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cache-dir", default=None, help=f"default: $EYAS_CACHE/{CACHE_NAME} or ~/.cache/eyas/{CACHE_NAME}"
    )
    ap.add_argument("--force", action="store_true", help="rebuild even if a complete build is there")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help=f"training steps (default {TRAIN_STEPS})")
    args = ap.parse_args(argv)
    print(ensure_demo_target(args.cache_dir, force=args.force, seed=args.seed, steps=args.steps))
    return 0
