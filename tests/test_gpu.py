"""GPU checks (marked `gpu`, skipped on CPU CI): the batched speculative loop stays lossless on
CUDA (fp32 and bf16, chains and a tree, 4 requests in flight), and TTT matches the inference chain
there within bf16 tolerance."""

import pytest
import torch

from eyas.serve.decoding.engine import Engine, Request
from eyas.serve.decoding.reference import greedy_generate
from eyas.serve.decoding.sampling import SamplingParams
from eyas.serve.decoding.tree import TreeShape
from eyas.train.model import KVCache
from eyas.train.ttt import ttt_forward

from test_train_serve_consistency import make_draft
from tiny_targets import draft_for, tiny_gpt_oss

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lossless_on_cuda(dtype):
    target = tiny_gpt_oss(seed=0, layers=4, hidden=64, window=8)
    draft = draft_for(target, 0).to("cuda", dtype)
    target = target.to("cuda", dtype)
    prompts = [list(range(2, 2 + 20 + i)) for i in range(4)]
    refs = [greedy_generate(target, p, max_new_tokens=32)[0] for p in prompts]
    for shape in (TreeShape.chain(1), TreeShape.chain(3), TreeShape.chain(5), TreeShape(3, 2, 6)):
        eng = Engine(target, draft, shape, max_batch=4)
        reqs = eng.run([Request(p, SamplingParams(temperature=0, max_tokens=32)) for p in prompts])
        assert [r.tokens for r in reqs] == refs, shape


def test_ttt_matches_chain_on_cuda():
    d = make_draft(0).cuda()
    ids = torch.randint(0, 97, (1, 12), device="cuda")
    aux = torch.randn(1, 12, 96, device="cuda")
    with torch.no_grad():
        out = ttt_forward(d, aux, ids, torch.ones(1, 12, device="cuda"), torch.tensor([12]), None, ttt_steps=4)
        cache = KVCache()
        h, logits = d.step(ids[:, 1:6], d.fuse(aux)[:, :5], torch.arange(5, device="cuda")[None], cache)
        hidden = h[:, -1:]
        for j in range(1, 4):
            hidden, logits = d.step(ids[:, 5 + j:6 + j], hidden, torch.tensor([[4 + j]], device="cuda"), cache)
            assert (logits[0, 0] - out.logits[j][0, 4]).abs().max().item() <= 1e-4
