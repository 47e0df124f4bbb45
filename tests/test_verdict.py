"""The greedy loop's verdict (eval/verdict.py): in fp32 any parting from plain greedy decoding is a failure;
in bf16 the parting is classified from the target computed again at that token, numerical (the target's own
computations disagree there) or a failure (the target would not emit the loop's token)."""

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_targets import draft_for, tiny_gpt_oss
from tqdm import tqdm

from eyas.data.target import compute_dtype
from eyas.eval.benchmarks import Benchmark
from eyas.eval.evaluate import Point, Settings, Sweep, measure_point
from eyas.eval.load import run_engine
from eyas.eval.report import partings_note
from eyas.eval.verdict import classify, verdict
from eyas.recipes.types import TreeShape
from eyas.serve.decoding.engine import Engine
from eyas.serve.decoding.reference import greedy_generate
from eyas.serve.decoding.sampling import SamplingParams

K, T = 3, 48


@pytest.fixture(scope="module")
def demo_target_bf16():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eyas.data.chat import render_prompt
    from eyas.data.target import resolve_path

    path = resolve_path("eyas-demo")
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    prompt = render_prompt(
        AutoTokenizer.from_pretrained(path), [{"role": "user", "content": "What is 17 + 25?"}]
    )
    return target, prompt


def loop(target, draft, prompts):
    eng = Engine(target, draft, TreeShape.chain(K), max_batch=1)
    res = run_engine(eng, prompts, [SamplingParams(temperature=0, max_tokens=T) for _ in prompts], 1)
    eng.close()
    return res


@contextlib.contextmanager
def one_row_split_k(model):
    """The target's nn.Linear layers (gpt-oss: q, k, v, o and lm_head; its router and experts are not
    nn.Linear), in a forward of one row, reduce over their inputs in two halves, each rounded to the model's
    dtype before the sum: a stand-in for the kernel-dependent rounding that makes a bf16 target's one-token
    step part from its several-token verification (a GEMM library picks other kernels, split-K among them,
    for a skinny input). CPUs differ here: on an AMD EPYC with AVX512-BF16 the kernels for one row and for
    several already round differently (6 of 16 outputs of the test below parted by themselves there); on an
    AVX2-only EPYC a bf16 matmul gives the same bits for any row count, and there, as on an Intel Xeon with
    AMX, no output parts by itself (0 of 16). This makes the rounding differ on every CPU; the CPU's own
    kernels add to it."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

    def split(m):
        def forward(x):
            if x.numel() != x.shape[-1]:  # several rows: the model's own kernel
                return F.linear(x, m.weight, m.bias)
            h = x.shape[-1] // 2
            y = F.linear(x[..., :h], m.weight[:, :h]) + F.linear(x[..., h:], m.weight[:, h:])
            return y if m.bias is None else y + m.bias

        return forward

    for m in linears:
        m.forward = split(m)
    try:
        yield
    finally:
        for m in linears:
            del m.forward


def test_real_bf16_partings_are_numerical_and_fp32_has_none():
    """A random 128-wide gpt-oss (transformers' GptOssForCausalLM, the demo target's class; random weights
    make close top-two logits common) and a random draft, 8 prompts x 48 tokens at k = 3. In fp32 the loop
    is exact. In bf16, with the one-token forwards rounding as a split-K kernel does (`one_row_split_k`),
    outputs part from plain greedy decoding (7 of 8 on an AVX2-only AMD EPYC, gaps 0.03 to 2.2): every
    parting is numerical, plain decoding ranks its own token first (gap > 0, or a tie that argmax breaks to
    the lower id), and the loop's token is the loop's. A classifier that called every parting a failure, or
    that took the greedy token for the loop's, fails here."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 128, (20 + i,), generator=g).tolist() for i in range(8)]
    target = tiny_gpt_oss(seed=0, layers=4, hidden=128, window=8)
    draft = draft_for(target, 0)
    res = loop(target, draft, prompts)
    assert res.outputs == [greedy_generate(target, p, T)[0] for p in prompts]  # fp32: exact
    target, draft = target.to(torch.bfloat16), draft.to(torch.bfloat16)
    assert compute_dtype(target) == torch.bfloat16 == draft.fc.weight.dtype
    with one_row_split_k(target):
        refs = [greedy_generate(target, p, T)[0] for p in prompts]
        res = loop(target, draft, prompts)
        numerical, failures, partings = verdict(target, prompts, res.outputs, refs, res.emitted, K + 1)
    print(f"bf16: {numerical} of {len(prompts)} outputs part from greedy, all numerical: {partings}")
    assert numerical >= 1 and failures == 0  # 7 of 8 seen on the AVX2-only EPYC
    assert len(partings) == sum(o != r for o, r in zip(res.outputs, refs))
    for p in partings:
        assert p["loop_token"] == res.outputs[p["prompt"]][p["at"]] != p["greedy_token"]
        assert p["gap"] > 0 or (p["gap"] == 0 and p["greedy_token"] < p["loop_token"])
    report = {"results": [{"partings": partings, "failures": failures}]}
    assert partings_note(report).startswith(f"; {numerical} numerical parting(s) (plain decoding's lead")


def test_an_injected_wrong_token_is_a_failure(demo_target_bf16):
    """The demo target in bf16 and its greedy output with one token replaced by one the target ranks low,
    classified along the loop's rounds: a failure, with its gap; the report is then not lossless."""
    target, prompt = demo_target_bf16
    # any draft (the verdict reads the target), built on an fp32 copy: .float() would convert the fixture
    draft = draft_for(copy.deepcopy(target).float(), 0).to(torch.bfloat16)
    assert compute_dtype(target) == torch.bfloat16 == draft.fc.weight.dtype  # the bf16 verdict, in bf16
    res = loop(target, draft, [prompt])
    ref = greedy_generate(target, prompt, T)[0]
    at = 10
    assert len(ref) > 12 and len(res.outputs[0]) > at  # the loop's rounds (emitted) reach the injected token
    with torch.no_grad():
        logits = target(torch.tensor([prompt + ref[:at]])).logits[0, -1].float()
    wrong = int(logits.argsort()[len(logits) // 2])  # a middling token: no computation ranks it first
    bad = ref[:at] + [wrong] + ref[at + 1 :]
    p = classify(target, prompt, bad, ref, res.emitted[0], K + 1)
    assert (p.at, p.loop_token, p.greedy_token, p.kind) == (at, wrong, ref[at], "failure")
    assert p.gap > 1.0 and p.gap == pytest.approx(float(logits[ref[at]] - logits[wrong]), abs=0.25)
    numerical, failures, _ = verdict(target, [prompt], [bad], [ref], res.emitted, K + 1)
    assert (numerical, failures) == (0, 1)


def test_an_fp32_near_tie_parting_is_a_failure():
    """In fp32 the loop is exact, so a parting is a failure however close the tie: the loop's own output on a
    random fp32 gpt-oss against a reference that takes the runner-up where the output's top two logits are
    closest (what a loop bug flipping near-ties would emit). The row, measured by eval's measure_point, is
    reported not lossless, the parting a failure with its small gap. The classifier bf16 targets get would
    have called it numerical (the loop's token is the fp32 target's own first choice): that was the hole."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 128, (20 + i,), generator=g).tolist() for i in range(4)]
    target = tiny_gpt_oss(seed=0, layers=4, hidden=128, window=8)
    draft = draft_for(target, 0)
    assert compute_dtype(target) == torch.float32
    out = loop(target, draft, prompts).outputs[0]
    with torch.no_grad():
        logits = target(torch.tensor([prompts[0] + out])).logits[0, len(prompts[0]) - 1 : -1]
    top = logits.topk(2)
    gaps = top.values[:, 0] - top.values[:, 1]
    at = int(gaps.argmin())
    assert int(top.indices[at, 0]) == out[at]
    ref = out[:at] + [int(top.indices[at, 1])]
    params = [SamplingParams(temperature=0, max_tokens=T) for _ in prompts]
    refs = [ref] + [greedy_generate(target, p, T)[0] for p in prompts[1:]]
    bench = Benchmark("t", "t", [[]] * len(prompts), [None] * len(prompts))
    point = Point(bench, prompts, params, refs, 0.0, 1)
    settings = Settings([("d", "")], [K], [TreeShape.chain(K)], [1], [0.0], [])
    sweep = Sweep()
    measure_point(target, set(), [("d", draft)], settings, point, tqdm(disable=True), sweep)
    row = sweep.results[0]
    assert (row["lossless"], row["num_mismatched"], row["failures"], row["numerical_partings"]) == (
        False,
        1,
        1,
        0,
    )
    (p,) = row["partings"]
    assert (p["prompt"], p["at"], p["loop_token"], p["kind"]) == (0, at, out[at], "failure")
    assert p["gap"] == pytest.approx(
        -float(gaps[at]), abs=1e-4
    )  # plain decoding ranks the loop's token first
    emitted = loop(target, draft, prompts[:1]).emitted[0]
    assert (
        classify(target, prompts[0], out, ref, emitted, K + 1).kind == "numerical"
    )  # bf16's rule: not exact
