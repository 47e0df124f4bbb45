"""TTT step j must produce the logits the inference-time drafting loop produces (fp32, <= 1e-4), with
the dense reference attention and the O(T) chunked one, for every draft option (train/model.py), the
sliding window included."""

import pytest
import torch

from eyas.train.kinds.config import DraftConfig
from eyas.train.model import Eagle3Draft, KVCache
from eyas.train.packing import doc_ids_from_lengths
from eyas.train.ttt import ttt_forward

OPTIONS = {
    "plain": {},
    "norm_before_fc": {"norm_before_fc": True},
    "norm_before_residual": {"norm_before_residual": True},
    "two_layers": {"num_layers": 2},
    "norm_output": {"norm_output": True},
    # a query at position p sees keys p - 7 .. p: in 13 positions and 7 steps most chains lose old keys
    "sliding_window": {"sliding_window": 8},
    "four_aux_and_all": {
        "aux_layer_ids": [1, 2, 3, 4],
        "norm_before_fc": True,
        "norm_before_residual": True,
        "num_layers": 3,
        "norm_output": True,
    },
}


def make_draft(seed, rope=None, H=32, heads=4, kv=2, **options):
    torch.manual_seed(seed)
    options = {"aux_layer_ids": [1, 2, 3], **options}
    cfg = DraftConfig(
        hidden_size=H,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=H // heads,
        intermediate_size=48,
        vocab_size=97,
        draft_vocab_size=40,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0},
        **options,
    )
    d = Eagle3Draft(cfg).float().eval()
    d.reset_parameters(std=0.2)  # large weights so that steps differ noticeably
    with torch.no_grad():  # norms away from 1, so that a norm applied in the wrong place shows
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return d


YARN = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 64,
}
# the plain draft under both attentions and both RoPEs; each option once (chunked attention, YaRN)
CASES = [
    (seed, rope, attention, "plain")
    for attention in ("dense", "chunked")
    for seed, rope in ((0, None), (1, YARN))
]
CASES += [(2, YARN, "chunked", option) for option in OPTIONS if option != "plain"]
CASES += [(4, None, "dense", "sliding_window")]


@pytest.mark.parametrize("seed,rope,attention,option", CASES)
def test_ttt_logits_equal_inference_chain(seed, rope, attention, option, monkeypatch):
    """fp32, within 1e-4 for the plain draft and 3e-4 for the options: their larger activations (normed
    residuals, deeper stacks) put fp32's summation-order differences, which vary with the thread count, at
    about 1e-4 by step 6 (the attention keeps fp32 statistics, so fp64 would not be tighter)."""
    monkeypatch.setattr("eyas.train.attention.tile_size", lambda *a: 4)  # several tiles in 13 positions
    d = make_draft(seed, rope, **OPTIONS[option])
    tol = 1e-4 if option == "plain" else 3e-4
    B, T, steps = 2, 13, 7
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (B, T), generator=g)
    aux = torch.randn(B, T, d.config.fc_in_features, generator=g) * 3
    lengths = torch.tensor([T, T])
    with torch.no_grad():
        out = ttt_forward(
            d,
            aux,
            ids,
            torch.ones(B, T),
            doc_ids_from_lengths(lengths, T),
            None,
            ttt_steps=steps,
            attention=attention,
        )
        fused = d.fuse(aux)
        for b in range(B):
            for i in range(T - 1):  # chain after the verified prefix x_0..x_{i+1}
                cache = KVCache()
                # step 0: prefix states g_0..g_i with tokens x_1..x_{i+1} at positions 0..i
                pos = torch.arange(i + 1)[None]
                h, logits = d.step(ids[b : b + 1, 1 : i + 2], fused[b : b + 1, : i + 1], pos, cache)
                torch.testing.assert_close(logits[0, i], out.logits[0][b, i], atol=tol, rtol=0)
                hidden = h[:, -1:]
                for j in range(1, steps):
                    if i + 1 + j >= T:
                        break
                    tok = ids[b : b + 1, i + 1 + j : i + 2 + j]  # teacher-forced x_{i+1+j}
                    hidden, logits = d.step(tok, hidden, torch.tensor([[i + j]]), cache)
                    diff = (logits[0, 0] - out.logits[j][b, i]).abs().max().item()
                    assert diff <= tol, f"step {j} index {i}: max abs diff {diff}"


def test_steps_actually_differ():
    """Guard against a vacuous pass: the chain's logits change from step to step."""
    d = make_draft(3)
    ids = torch.randint(0, 97, (1, 9))
    aux = torch.randn(1, 9, 96)
    with torch.no_grad():
        out = ttt_forward(
            d, aux, ids, torch.ones(1, 9), torch.zeros(1, 9, dtype=torch.long), None, ttt_steps=3
        )
    assert (out.logits[0] - out.logits[1]).abs().max() > 1e-2
    assert (out.logits[1] - out.logits[2]).abs().max() > 1e-2
