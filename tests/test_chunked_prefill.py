"""Long prompts in the serving loop: the target's attention in query blocks (train/blocked_attention.py) is
transformers' eager attention, sinks and sliding windows included; chunked prefill (eval.prefill_tokens) gives
the unchunked loop's outputs; the references and the verdict prefill in chunks too; a long prompt at gpt-oss's
attention sizes stays within `eyas plan`'s eval figure, far below one eager score tensor."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from tiny_targets import draft_for, tiny_gpt_oss
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager
from transformers.models.llama.modeling_llama import eager_attention_forward as llama_eager

from eyas.recipes.types import TreeShape
from eyas.serve.decoding.engine import Engine, Request
from eyas.serve.decoding.reference import greedy_generate, prefill
from eyas.serve.decoding.sampling import SamplingParams
from eyas.train.blocked_attention import blocked_attention, set_block_bytes

WORKER = Path(__file__).with_name("long_prompt_worker.py")


@pytest.fixture
def block_bytes():
    """set_block_bytes(n) for the test, the default back after it."""
    from eyas.train.blocked_attention import BLOCK_BYTES

    yield set_block_bytes
    set_block_bytes(BLOCK_BYTES)


def attention_inputs(dtype, B=2, H=8, Hkv=2, q=37, kv=101, d=16):
    g = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(B, h, n, d, generator=g).to(dtype) for h, n in ((H, q), (Hkv, kv), (Hkv, kv)))
    allowed = torch.rand(B, 1, q, kv, generator=g) > 0.5
    allowed[..., 0] = True  # every query row sees a key
    sinks = torch.randn(H, generator=g).to(dtype)
    module = types.SimpleNamespace(num_key_value_groups=H // Hkv, sinks=sinks, training=False)
    additive = torch.zeros(B, 1, q, kv, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return module, Q, K, V, allowed, additive


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_blocked_attention_is_transformers_eager_attention(dtype, block_bytes):
    """One block: bitwise transformers' eager attention, gpt-oss's (sinks, softmax in the dtype) and Llama's
    (fp32 softmax), GQA (8 query heads on 2 KV heads), a random mask. Blocks of a few rows, each reading only
    the keys its rows see: the same within 2e-7 in fp32 (the sums over keys in another order)."""
    module, Q, K, V, allowed, additive = attention_inputs(dtype)
    block_bytes(1 << 40)
    ours = blocked_attention(module, Q, K, V, allowed, 0.25, s_aux=module.sinks)[0]
    assert torch.equal(ours, gpt_oss_eager(module, Q, K, V, additive, scaling=0.25)[0])
    assert torch.equal(
        blocked_attention(module, Q, K, V, allowed, 0.25)[0],
        llama_eager(module, Q, K, V, additive, scaling=0.25)[0],
    )
    if dtype == torch.float32:
        block_bytes(5000)  # 4 rows a block here
        small = blocked_attention(module, Q, K, V, allowed, 0.25, s_aux=module.sinks)[0]
        assert (small - ours).abs().max() <= 2e-7 * ours.abs().max()


def test_a_gpt_oss_forward_through_the_blocks_is_its_eager_forward(block_bytes):
    """A random gpt-oss (sinks, sliding window 8 on every other layer) over 300 tokens, once with
    transformers' eager attention and its additive masks, once with "eyas_blocked" and the bool masks
    transformers makes for it (none at all where it finds the mask plainly causal: the blocks then apply
    causality and the window themselves), blocks of a few rows: the same logits within 1e-5 of their largest.
    """
    import copy

    from eyas.train.blocked_attention import use_blocked_attention

    eager = tiny_gpt_oss(seed=0, layers=4, hidden=128, window=8)
    eager.set_attn_implementation("eager")
    blocked = copy.deepcopy(eager)
    use_blocked_attention(blocked)
    block_bytes(20000)
    x = torch.randint(2, 128, (2, 300), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, got = eager(x).logits, blocked(x).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def run(target, draft, prompts, prefill_tokens, shape=TreeShape.chain(3), temperature=0.0, batch=4):
    eng = Engine(target, draft, shape, max_batch=batch, prefill_tokens=prefill_tokens)
    reqs = [
        Request(p, SamplingParams(temperature=temperature, max_tokens=24, seed=i))
        for i, p in enumerate(prompts)
    ]
    eng.run(reqs)
    eng.close()
    return [(r.tokens, r.accepted) for r in reqs]


@pytest.fixture(scope="module")
def tiny():
    target = tiny_gpt_oss(seed=0, layers=4, hidden=128, window=8)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 128, (n,), generator=g).tolist() for n in (300, 17, 151, 64)]
    return target, draft_for(target, 0), prompts


@pytest.mark.parametrize(
    "shape,temperature",
    [(TreeShape.chain(3), 0.0), (TreeShape.chain(3), 1.0), (TreeShape.parse("3,2,6"), 0.0)],
    ids=["greedy", "T=1", "tree"],
)
def test_chunked_prefill_gives_the_unchunked_loops_outputs(tiny, block_bytes, shape, temperature):
    """A random gpt-oss (sinks, window 8) and draft, prompts of 300, 17, 151 and 64 tokens, 4 and 2 in flight:
    prefilled in chunks of 32 (or 50) tokens with attention blocks of a few rows, every output token and every
    verification's accepted count equal one prefill forward's with one block (eager's math, bitwise)."""
    target, draft, prompts = tiny
    block_bytes(1 << 40)
    whole = run(target, draft, prompts, 1 << 30, shape, temperature)
    block_bytes(20000)
    assert run(target, draft, prompts, 32, shape, temperature) == whole
    block_bytes(3000)
    assert run(target, draft, prompts, 50, shape, temperature, batch=2) == whole


def test_a_ragged_group_prefilled_in_chunks_gives_the_unchunked_outputs(tiny, block_bytes):
    """Admission groups prompts only while they fit one forward, so a chunked prefill is one prompt's; the
    engine's chunk arithmetic is general, and here it runs on a group of four ragged prompts (300, 17, 151, 64
    tokens) in chunks of 48 columns: rows whose padding spans whole chunks, rows whose padding ends inside
    one. Their outputs and accepted counts equal one forward's."""
    target, draft, prompts = tiny
    block_bytes(20000)
    whole = run(target, draft, prompts, 1 << 30)
    eng = Engine(target, draft, TreeShape.chain(3), max_batch=4, prefill_tokens=4 * 48)
    reqs = [
        eng.add(Request(p, SamplingParams(temperature=0.0, max_tokens=24, seed=i)))
        for i, p in enumerate(prompts)
    ]
    group = list(eng.waiting)
    eng.waiting.clear()
    with torch.no_grad():
        eng._prefill(group)  # 4 rows of 300 columns, 48 columns a forward
    while eng.busy:
        eng.step()
    eng.close()
    assert [(r.tokens, r.accepted) for r in reqs] == whole


def test_references_and_the_verdicts_prefill_in_chunks(tiny, block_bytes):
    """greedy_generate with generate's chunked prefill gives the unchunked reference, which the chunked loop's
    output equals (lossless); reference.prefill in chunks gives one forward's next-token logits (1e-5)."""
    target, draft, prompts = tiny
    block_bytes(1 << 40)
    refs = [greedy_generate(target, p, 24)[0] for p in prompts]
    whole = prefill(target, prompts[0], 1 << 30)[0]
    block_bytes(20000)
    assert [greedy_generate(target, p, 24, prefill_tokens=40)[0] for p in prompts] == refs
    assert [out for out, _ in run(target, draft, prompts, 32)] == refs
    chunked = prefill(target, prompts[0], 40)[0]
    assert (chunked - whole).abs().max() <= 1e-5 * whole.abs().max()


def test_a_4k_prompt_at_gpt_oss_attention_sizes_stays_within_the_plan():
    """tests/long_prompt_worker.py in a process of its own: 4,096 tokens through a gpt-oss with gpt-oss-120b's
    attention sizes (64 heads, fp32), prefilled in chunks of 512 with attention blocks of 64 MiB, and its
    greedy reference. The peak RSS above the loaded weights stays within `eyas plan`'s KV + activations for
    that request, and below a quarter of one (64, 4096, 4096) fp32 score tensor (4.3 GB), which an unchunked
    eager forward makes several times; the loop is lossless. Measured on the 2-core EPYC: 0.18 GB against a
    plan of 0.30 GB."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, str(WORKER), "4096", "512", "64"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"4K prompt: peak {res['measured'] / 1e9:.3f} GB, plan {res['planned'] / 1e9:.3f} GB")
    assert res["lossless"] and res["tokens"] == 8
    assert res["measured"] <= res["planned"] <= res["eager_scores"] / 4
