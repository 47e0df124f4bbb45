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
import fcntl
import json
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from eyas.demo_target.corpus import generate_conversations, write_prompts
from eyas.demo_target.model import ARCHITECTURE, init_model
from eyas.demo_target.quality import measure
from eyas.demo_target.tokenizer import build_tokenizer, corpus_texts
from eyas.demo_target.training import encode, make_batches, train
from eyas.io import write_json

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
    root = os.environ.get("EYAS_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "eyas") / CACHE_NAME


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


def _complete_build(path: Path, params: dict) -> bool:
    """Whether `path` holds a finished build made with `params`."""
    try:
        return json.loads((path / MARKER).read_text())["build"] == params
    except (OSError, ValueError, KeyError):
        return False


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


def _remove_stale_builds(cache_dir: Path) -> None:
    """Delete the temporary directories of `cache_dir` (`.NAME.tmp-PID`, `.NAME.old-PID`) left
    by processes that no longer run."""
    parent, name = cache_dir.parent, cache_dir.name
    for stray in [*parent.glob(f".{name}.tmp-*"), *parent.glob(f".{name}.old-*")]:
        try:
            os.kill(int(stray.name.rsplit("-", 1)[1]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(stray, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def ensure_demo_target(
    cache_dir: str | Path | None = None,
    force: bool = False,
    seed: int = 0,
    progress: bool = True,
    steps: int | None = None,
) -> Path:
    """The demo target's directory (see the module docstring), built on first use.

    A complete build made with the same `seed` and `steps` is returned at once unless `force`.
    `steps` overrides the number of training steps (default TRAIN_STEPS); a handful gives an
    untrained-looking but complete target in seconds, for tests."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    params = _build_params(seed, TRAIN_STEPS if steps is None else steps)
    if not force and _complete_build(cache_dir, params):
        return cache_dir
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    # one build at a time under a cache root (a lock on the directory itself: no file left behind): a
    # second process (another test process, another rank) waits for the first and finds its build
    lock = os.open(cache_dir.parent, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _complete_build(cache_dir, params):
            return cache_dir
        return _build_into(cache_dir, params, seed, force, progress)
    finally:
        os.close(lock)  # releases the lock


def _build_into(cache_dir: Path, params: dict, seed: int, force: bool, progress: bool) -> Path:
    """Build into a temporary sibling of `cache_dir`, then swap it into place."""
    _remove_stale_builds(cache_dir)
    tmp = cache_dir.parent / f".{cache_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        info = build_demo_target(tmp, seed=seed, steps=params["steps"], progress=progress)
        if not force and _complete_build(cache_dir, params):  # another process finished the same build first
            return cache_dir
        if cache_dir.exists():  # an outdated or unfinished build: swap, then delete it
            old = cache_dir.parent / f".{cache_dir.name}.old-{os.getpid()}"
            os.replace(cache_dir, old)
            os.replace(tmp, cache_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, cache_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        _report(cache_dir, info)
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
