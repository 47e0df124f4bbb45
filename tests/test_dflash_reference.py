"""An independent check of eyas's DFlash block: a reference forward written from vLLM 0.32's qwen3_dflash.py
(DFlashQwen3Model: precompute_and_store_context_kv, then forward over the block) with plain tensor
operations on the checkpoint's named weights, none of eyas's layer, attention, norm or RoPE code. eyas's loop
block (DFlashDraft.block after write_context) and training's block (dflash_forward) equal it in fp32.

What vLLM does, step by step (names as in the checkpoint, which are vLLM's and z-lab's):
  context = hidden_norm(fc(aux))                       one per committed position, positions 0 .. n-1
  per layer: k_ctx = RoPE(k_norm(context @ k_proj)), v_ctx = context @ v_proj      (no input_layernorm)
  block x = embed([x_n, mask, ..., mask]) at positions n .. n+S-1
  per layer (pre-norm, residual): h = input_layernorm(x); q, k, v = h @ q/k/v_proj (+ bias);
      q, k = RoPE(q_norm(q)), RoPE(k_norm(k)) per head (neox rotate-half);
      attention of every block slot over [k_ctx ; k] (non-causal, GQA), scale head_dim ** -0.5;
      x = x + o_proj(attn); x = x + down(silu(gate(h2)) * up(h2)), h2 = post_attention_layernorm(x)
  logits = lm_head(norm(x)); slot s >= 1 drafts x_{n+s}
"""

import pytest
import torch
from test_dflash import dflash, loop_block

from eyas.train.kinds.dflash.core import dflash_forward


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    """x (L, heads, d) at integer positions pos (L,): neox rotate-half with inv_freq theta ** (-2i / d)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (pos.double()[:, None] * inv[None]).float()  # (L, d / 2)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def linear(w, x, name):
    out = x @ w[name + ".weight"].T
    return out + w[name + ".bias"] if name + ".bias" in w else out


def reference_block(w: dict, cfg, aux: torch.Tensor, anchor: int, mask_id: int) -> torch.Tensor:
    """w: the draft's state dict; aux (n, n_aux * H_t) the committed positions' aux states (positions 0 ..
    n-1); anchor: x_n's token id -> logits (S, V_d) of the block [x_n, mask x S-1] at positions n .. n+S-1."""
    n, S, eps = aux.shape[0], cfg.block_size, cfg.rms_norm_eps
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    theta = cfg.rope_parameters["rope_theta"]
    ctx = rms(aux @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # (n, H)
    ids = torch.tensor([anchor] + [mask_id] * (S - 1))
    x = w["embed_tokens.weight"][ids]  # (S, H)
    ctx_pos, pos = torch.arange(n), n + torch.arange(S)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        a = p + "self_attn."
        k_norm = w[a + "k_norm.weight"]
        kc = rope(rms(linear(w, ctx, a + "k_proj").view(n, nkv, hd), k_norm, eps), ctx_pos, theta)
        vc = linear(w, ctx, a + "v_proj").view(n, nkv, hd)
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = rope(rms(linear(w, h, a + "q_proj").view(S, nh, hd), w[a + "q_norm.weight"], eps), pos, theta)
        k = rope(rms(linear(w, h, a + "k_proj").view(S, nkv, hd), k_norm, eps), pos, theta)
        v = linear(w, h, a + "v_proj").view(S, nkv, hd)
        keys = torch.cat([kc, k]).repeat_interleave(nh // nkv, 1)  # (n + S, nh, hd)
        values = torch.cat([vc, v]).repeat_interleave(nh // nkv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) * hd**-0.5
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).reshape(S, nh * hd)
        x = x + linear(w, o, a + "o_proj")
        h2 = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = linear(w, h2, p + "mlp.gate_proj"), linear(w, h2, p + "mlp.up_proj")
        x = x + linear(w, torch.nn.functional.silu(gate) * up, p + "mlp.down_proj")
    return rms(x, w["norm.weight"], eps) @ w["lm_head.weight"].T


@pytest.mark.parametrize(
    "options", [{}, {"attention_bias": True, "num_layers": 1}, {"num_key_value_heads": 4}]
)
def test_eyas_dflash_block_equals_a_reference_written_from_vllm(options):
    """For every anchor n of a 12-token row: the loop's block and training's block (slot s: draft s - 1 at
    index n - 1) equal the reference forward above within 1e-5 (fp32), two layers (or one, with q/k/v/o
    biases) of grouped (or as many) key-value heads; a changed context state changes the reference's
    logits as much as eyas's (the context is read, not ignored)."""
    d = dflash(5, **options)
    cfg, w = d.config, {k: v.detach() for k, v in d.state_dict().items()}
    S, T = cfg.block_size, 12
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 97, (T,), generator=g)
    aux = torch.randn(T, cfg.fc_in_features, generator=g) * 3
    with torch.no_grad():
        train = dflash_forward(
            d, aux[None], ids[None], torch.ones(1, T), torch.zeros(1, T).long(), None, S - 1
        )
        for n in range(1, T - 1):
            want = reference_block(w, cfg, aux[:n], int(ids[n]), cfg.mask_token_id)
            loop = loop_block(d, aux, ids, 0, n, S)
            assert torch.allclose(loop, want, atol=1e-5), (n, (loop - want).abs().max())
            for s in range(1, S):
                got = train.logits[s - 1][0, n - 1]
                assert torch.allclose(got, want[s], atol=1e-5), (n, s, (got - want[s]).abs().max())
        moved = aux.clone()
        moved[2] += 1.0
        other = reference_block(w, cfg, moved[:6], int(ids[6]), cfg.mask_token_id)
        assert (other - reference_block(w, cfg, aux[:6], int(ids[6]), cfg.mask_token_id)).abs().max() > 1e-3
        assert torch.allclose(loop_block(d, moved, ids, 0, 6, S), other, atol=1e-5)
