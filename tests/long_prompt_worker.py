"""Worker of tests/test_chunked_prefill.py, in a process of its own (its peak RSS is the measurement): a
gpt-oss at gpt-oss-120b's attention sizes (hidden 2880, 64 query heads of 64, 8 KV heads, sinks, sliding
window 128 on every other layer; 2 layers, 2 small experts, a 2,048-token vocabulary, random weights, fp32)
and a random draft at its dims. After a warm-up the peak RSS is reset, then the loop (chain k = 2, greedy)
and the greedy reference run on one prompt of T tokens, in prefill chunks of P tokens with attention blocks
of M MiB. Prints one JSON line: the peak RSS above the loaded baseline, `eyas plan`'s KV + activations for
that request, the size of one copy of the score tensor an unchunked eager forward would make, and whether the
loop's output is the reference's.

    MALLOC_MMAP_THRESHOLD_=131072 python tests/long_prompt_worker.py T P M

(glibc's fixed mmap threshold: freed activations go back to the system, so the peak RSS follows the bytes
live at once; benchmarks/bench_long_prompt.py measures the same way on the full-width target.)
"""

from __future__ import annotations

import json
import re
import sys

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from eyas.plan.eval_memory import eval_memory
from eyas.recipes.load import load_recipe
from eyas.recipes.types import TreeShape
from eyas.serve.decoding.engine import Engine, Request
from eyas.serve.decoding.reference import greedy_generate
from eyas.serve.decoding.sampling import SamplingParams
from eyas.train.blocked_attention import set_block_bytes
from eyas.train.kinds.config import DraftConfig
from eyas.train.model import Eagle3Draft

NEW, K = 8, 2


def peak() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def models():
    torch.manual_seed(0)
    cfg = GptOssConfig(
        num_hidden_layers=2,
        num_local_experts=2,
        num_experts_per_tok=2,
        vocab_size=2048,
        hidden_size=2880,
        intermediate_size=256,
        head_dim=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        sliding_window=128,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
        pad_token_id=0,
        eos_token_id=1,
    )
    target = GptOssForCausalLM(cfg).float().eval()
    dcfg = DraftConfig.from_target_config(cfg, [1, 1, 2], draft_vocab_size=1024, intermediate_size=256)
    draft = Eagle3Draft(dcfg)
    draft.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight)
    kept = torch.arange(1024) * 2
    t2d = torch.zeros(2048, dtype=torch.bool)
    t2d[kept] = True
    draft.set_vocab_map(kept - torch.arange(1024), t2d)
    return target, draft.eval()


def loop(target, draft, prompt, chunk):
    eng = Engine(target, draft, TreeShape.chain(K), max_batch=1, prefill_tokens=chunk)
    (req,) = eng.run([Request(prompt, SamplingParams(temperature=0, max_tokens=NEW))])
    eng.close()
    return req.tokens


def main(T: int, chunk: int, block_mb: int) -> None:
    torch.set_num_threads(1)
    target, draft = models()
    prompt = torch.randint(2, 2048, (T,), generator=torch.Generator().manual_seed(1)).tolist()
    set_block_bytes(block_mb << 20)
    loop(target, draft, prompt[:64], chunk)  # warm-up: first calls' buffers, as eval's warm-up
    greedy_generate(target, prompt[:64], 2, prefill_tokens=chunk)
    reset_peak()
    base = peak()
    out = loop(target, draft, prompt, chunk)
    ref = greedy_generate(target, prompt, NEW, prefill_tokens=chunk)[0]
    measured = peak() - base
    recipe = load_recipe(
        {
            "data": {"max_prompt_tokens": T},
            "train": {"max_length": T},
            "eval": {
                "max_new_tokens": NEW,
                "concurrency": [1],
                "k": K,
                "prefill_tokens": chunk,
                "attention_block_mb": block_mb,
            },
        }
    )
    planned = eval_memory(recipe, target.config, draft.config, 0.0, 4)
    eager = (
        64 * T * T * 4
    )  # one (heads, T, T) fp32 copy: what an unchunked eager forward makes, several times
    print(
        json.dumps(
            {
                "measured": measured,
                "planned": planned.kv + planned.activations,
                "eager_scores": eager,
                "lossless": out == ref,
                "tokens": len(out),
            }
        )
    )


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]))
