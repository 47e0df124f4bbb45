"""Long prompts in eyas's serving loop: peak memory against `eyas plan`'s eval figure, and the chunked loop's
outputs against the unchunked one's.

    python benchmarks/bench_long_prompt.py [--lengths 4096 8192 16384] [--unchunked-upto 4096]
                                           [--prefill-tokens 2048] [--block-mb 256] [--new 16] [--k 2]

The target is the full-width target (gpt-oss-120b's widths: hidden 2880, 64 query heads, 8 KV heads,
sinks, sliding window 128 on every other layer, vocab 201,088; 4 layers of 4 experts:
data/demo_target/full_width.py), the draft a random one at recipes/gpt-oss-120b.yaml's draft dims (vLLM ids
[2, 3, 4]), in bf16 where this CPU has bf16 arithmetic (else fp32). Each prompt length runs in a process of
its own:

    1. load the target and the draft, warm up (a 64-token request through the loop and the reference, as
       eval's warm-up: first calls pack weights, on this CPU a 1.16 GB bf16 copy of the lm_head, kept);
       the peak RSS is reset (/proc/self/clear_refs)
    2. the loop (serve/decoding/engine.py): one request, a prompt of L tokens (stdlib-long text, the test
       split, cut to L), greedy, chain k, --new tokens; eval.prefill_tokens = --prefill-tokens, attention
       blocks of --block-mb MiB (train/blocked_attention.py)
    3. the greedy reference (serve/decoding/reference.py: Hugging Face generate, prefilled in chunks too)
    4. the peak RSS above the loaded baseline (glibc's mmap threshold fixed: MALLOC below), against
       `eyas plan`'s KV + activations for one request of L + --new tokens at these settings
       (eyas/plan/eval_memory.py)
    5. where L <= --unchunked-upto: the loop again in one prefill forward with one attention block (eager's
       math as transformers runs it, bitwise), its output against the chunked loop's

Prints one line per length and a markdown table (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

# glibc raises its mmap threshold as large blocks are freed (up to 32 MB), after which freed activations stay
# in the heap and the peak RSS counts them again when the next ones land elsewhere; a fixed threshold returns
# every large block to the system when freed, so the peak RSS follows the bytes live at once
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def hwm_bytes() -> int:
    """The process's peak resident memory since the last reset (VmHWM)."""
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def setup(dtype):
    """The full-width target and a random draft at recipes/gpt-oss-120b.yaml's dims, both in `dtype`."""
    from transformers import AutoModelForCausalLM

    from eyas.data.target import resolve_path

    target = AutoModelForCausalLM.from_pretrained(resolve_path("eyas-full-width"), dtype=dtype).eval()
    draft, recipe = random_draft(target, dtype, ["capture.aux_layer_ids=[2,3,4]"])
    return target, draft, recipe


def random_draft(target, dtype, overrides=()):
    """A random draft at recipes/gpt-oss-120b.yaml's dims for `target` (its embedding, a draft vocabulary of
    every n-th id), in `dtype` on the target's device -> (draft, the recipe it follows)."""
    import torch

    from eyas.data.target import input_device, text_config
    from eyas.recipes.load import check_against_target, load_recipe
    from eyas.train.model import Eagle3Draft
    from eyas.train.trainer import draft_config

    recipe = load_recipe("gpt-oss-120b", ["target.model=eyas-full-width", *overrides])
    tcfg = text_config(target.config)
    ids = check_against_target(recipe, tcfg.num_hidden_layers, tcfg.vocab_size)
    torch.manual_seed(0)
    draft = Eagle3Draft(draft_config(recipe, tcfg, ids, recipe.vocab.draft_vocab_size))
    draft.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight)
    kept = torch.arange(draft.config.draft_vocab_size) * (tcfg.vocab_size // draft.config.draft_vocab_size)
    t2d = torch.zeros(tcfg.vocab_size, dtype=torch.bool)
    t2d[kept] = True
    draft.set_vocab_map(kept - torch.arange(len(kept)), t2d)
    return draft.to(input_device(target), dtype).eval(), recipe


def prompt_of(length: int) -> list[int]:
    """`length` tokens of stdlib-long's test split (the demo tokenizer's ids: the full-width target's too)."""
    from transformers import AutoTokenizer

    from eyas.data.long_text import records
    from eyas.data.target import resolve_path

    tok = AutoTokenizer.from_pretrained(resolve_path("eyas-full-width"))
    ids: list[int] = []
    for r in sorted(records("stdlib-long", "test"), key=lambda r: -len(r["prompt"])):
        ids += tok(r["prompt"])["input_ids"]
        if len(ids) >= length:
            return ids[:length]
    raise ValueError(f"stdlib-long's test split has fewer than {length} tokens")


def loop(target, draft, prompt, k: int, new: int, prefill_tokens: int, block_bytes: int):
    from eyas.recipes.types import TreeShape
    from eyas.serve.decoding.engine import Engine, Request
    from eyas.serve.decoding.sampling import SamplingParams
    from eyas.train.blocked_attention import set_block_bytes

    set_block_bytes(block_bytes)
    eng = Engine(target, draft, TreeShape.chain(k), max_batch=1, prefill_tokens=prefill_tokens)
    (req,) = eng.run([Request(prompt, SamplingParams(temperature=0, max_tokens=new))])
    eng.close()
    return req.tokens, req.accepted, req.emitted


def one_length(a) -> dict:
    """Steps 1-5 of the module docstring for one length, in this process."""
    import torch

    from eyas.data.target import native_bf16_cpu
    from eyas.plan.eval_memory import eval_memory
    from eyas.serve.decoding.reference import greedy_generate

    torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if native_bf16_cpu() else torch.float32
    prompt = prompt_of(a.length)
    target, draft, recipe = setup(dtype)
    # warm-up, as eval's: first calls pack weights (the CPU's bf16 lm_head: a 1.16 GB copy, kept), not timed
    loop(target, draft, prompt[:64], a.k, 2, a.prefill_tokens, a.block_mb << 20)
    greedy_generate(target, prompt[:64], 2, prefill_tokens=a.prefill_tokens)
    reset_peak()
    base = hwm_bytes()
    t0 = time.perf_counter()
    out, accepted, emitted = loop(target, draft, prompt, a.k, a.new, a.prefill_tokens, a.block_mb << 20)
    t1 = time.perf_counter()
    ref = greedy_generate(target, prompt, a.new, prefill_tokens=a.prefill_tokens)[0]
    t2 = time.perf_counter()
    peak = hwm_bytes() - base
    over = [
        f"data.max_prompt_tokens={a.length}",
        f"train.max_length={a.length}",
        f"eval.max_new_tokens={a.new}",
        "eval.concurrency=[1]",
        f"eval.k={a.k}",
        f"eval.prefill_tokens={a.prefill_tokens}",
        f"eval.attention_block_mb={a.block_mb}",
    ]
    from eyas.recipes.load import load_recipe

    planned = eval_memory(
        load_recipe(recipe.to_dict(), over), target.config, draft.config, 0.0, dtype.itemsize
    )
    res = {
        "length": a.length,
        "dtype": str(dtype).removeprefix("torch."),
        "peak_gb": peak / 1e9,
        "planned_gb": (planned.kv + planned.activations) / 1e9,
        "planned_kv_gb": planned.kv / 1e9,
        "loop_s": t1 - t0,
        "reference_s": t2 - t1,
        "equal": out == ref,
        "tokens": len(out),
    }
    if out != ref:  # bf16: the parting classified as eval does (eval/verdict.py)
        from eyas.eval.verdict import classify

        exact = dtype == torch.float32
        parting = classify(target, prompt, out, ref, emitted, a.k + 1, exact=exact, chunk=a.prefill_tokens)
        res["parting"] = {"at": parting.at, "kind": parting.kind, "gap": parting.gap}
    if a.length <= a.unchunked_upto:
        whole = loop(target, draft, prompt, a.k, a.new, a.length, 1 << 45)
        res["unchunked_equal"] = whole == (out, accepted, emitted)
    return res


def same(r: dict) -> str:
    """'yes', or where the loop's output parts from the reference, the verdict on that token."""
    if r["equal"]:
        return "yes"
    p = r["parting"]
    return f"parts at token {p['at']}: {p['kind']} (gap {p['gap']:.3g})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--unchunked-upto", type=int, default=4096)
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--block-mb", type=int, default=256)
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)  # one length, in this process
    a = p.parse_args()
    if a.length:
        print("RESULT " + json.dumps(one_length(a)), flush=True)
        return 0
    rows = []
    for n in a.lengths:
        cmd = [sys.executable, __file__, "--length", str(n), *sys.argv[1:]]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **MALLOC})
        found = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        if r.returncode or not found:
            print(r.stdout[-2000:], r.stderr[-4000:], file=sys.stderr)
            return 1
        rows.append(json.loads(found[0][7:]))
        print(rows[-1], flush=True)
    print(
        "\n| prompt tokens | peak above the loaded weights | eyas plan (KV + activations) | loop s | "
        "reference s | output = reference | unchunked equal |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        eq = {True: "yes", False: "**no**", None: "— (not run)"}[r.get("unchunked_equal")]
        plan = f"{r['planned_gb']:.2f} GB (KV {r['planned_kv_gb']:.2f})"
        print(
            f"| {r['length']:,} | {r['peak_gb']:.2f} GB | {plan} "
            f"| {r['loop_s']:.0f} | {r['reference_s']:.0f} | {same(r)} | {eq} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
