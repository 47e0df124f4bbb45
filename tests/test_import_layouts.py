"""Importing hand-built drafts of each published layout matches a reference forward written here.

The reference is an independent, minimal EAGLE-3 draft in float64, straight from vLLM's
llama_eagle3.py: [norm_before_fc: input_norm over the concatenated aux states] -> fc ->
[input_layernorm(embed) ‖ hidden_norm(g)] -> GQA attention with RoPE (neox halves) -> + residual
(g, or hidden_norm(g) with norm_before_residual) -> post_attention_layernorm -> SwiGLU MLP ->
+ residual -> [later layers: plain pre-norm Llama layers] -> norm -> lm_head. A causal prefix of new
tokens, then one chained step fed the last prefix position's prenorm output.
"""

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from test_export_support import (
    DRAFT_VOCAB,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    KV_HEADS,
    TARGET_LAYERS,
    VOCAB,
    random_vocab_map,
    target_embed,
    tiny_target,
)

from eyas.cli import main
from eyas.serve.interchange.importer import DraftFormatError, import_draft, load_published, main_import
from eyas.train.checkpoint import load_draft
from eyas.train.model import KVCache

INTER = 48
EPS = 1e-5


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("target"))


def layer_weights(seed, draft_vocab=DRAFT_VOCAB, n_aux=3, num_layers=1, norm_before_fc=False):
    """Weights under their EAGLE-3 release names (a layout renames the layer prefix): `midlayer.*`,
    later layers `layers.i.*`, `input_norm.weight` with norm_before_fc."""
    g = torch.Generator().manual_seed(seed)

    def lin(o, i):
        return torch.randn(o, i, generator=g) * 0.05

    def norm(n):
        return 1 + 0.1 * torch.randn(n, generator=g)

    def layer(prefix, first):
        width = 2 * HIDDEN if first else HIDDEN
        return {
            f"{prefix}input_layernorm.weight": norm(HIDDEN),
            **({f"{prefix}hidden_norm.weight": norm(HIDDEN)} if first else {}),
            f"{prefix}self_attn.q_proj.weight": lin(HEADS * HEAD_DIM, width),
            f"{prefix}self_attn.k_proj.weight": lin(KV_HEADS * HEAD_DIM, width),
            f"{prefix}self_attn.v_proj.weight": lin(KV_HEADS * HEAD_DIM, width),
            f"{prefix}self_attn.o_proj.weight": lin(HIDDEN, HEADS * HEAD_DIM),
            f"{prefix}post_attention_layernorm.weight": norm(HIDDEN),
            f"{prefix}mlp.gate_proj.weight": lin(INTER, HIDDEN),
            f"{prefix}mlp.up_proj.weight": lin(INTER, HIDDEN),
            f"{prefix}mlp.down_proj.weight": lin(HIDDEN, INTER),
        }

    weights = {"fc.weight": lin(HIDDEN, n_aux * HIDDEN), **layer("midlayer.", True)}
    for i in range(1, num_layers):
        weights.update(layer(f"layers.{i}.", False))
    if norm_before_fc:
        weights["input_norm.weight"] = norm(n_aux * HIDDEN)
    return {**weights, "norm.weight": norm(HIDDEN), "lm_head.weight": lin(draft_vocab, HIDDEN)}


def llama_fields(theta=None, eps=EPS):
    fields = {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": eps,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }
    if theta is not None:
        fields["rope_theta"] = theta
    return fields


def renamed(weights, prefix):
    return {
        (prefix + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in weights.items()
    }


def write(path, config, tensors, bin_file=False):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    if bin_file:
        torch.save(tensors, path / "pytorch_model.bin")
    else:
        save_file(tensors, str(path / "model.safetensors"))
    return path


# ---------------------------------------------------------------- the reference EAGLE-3 layer


def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def reference_layer(w, p, x_in, residual, pos, theta):
    """Attention + MLP of one layer (prefix p) on its normed input x_in (B, T, 2H or H), causal over the
    T entries at positions pos (T,): -> the layer's prenorm output (B, T, H)."""
    B, T, _ = x_in.shape
    q = (x_in @ w[p + "self_attn.q_proj.weight"].T).view(B, T, HEADS, HEAD_DIM)
    k = (x_in @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV_HEADS, HEAD_DIM)
    v = (x_in @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV_HEADS, HEAD_DIM)
    inv = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    ang = pos.double()[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1)[None, :, None], torch.cat([ang.sin()] * 2, -1)[None, :, None]

    def rope(t):
        t1, t2 = t[..., : HEAD_DIM // 2], t[..., HEAD_DIM // 2 :]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    q, k = rope(q), rope(k)
    group = HEADS // KV_HEADS
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(B, T, HEADS * HEAD_DIM)
    h = residual + o @ w[p + "self_attn.o_proj.weight"].T
    u = rms(h, w[p + "post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(u @ w[p + "mlp.gate_proj.weight"].T) * (u @ w[p + "mlp.up_proj.weight"].T)
    return h + mlp @ w[p + "mlp.down_proj.weight"].T


def reference_forward(w, embed, ids, hidden_in, theta, norm_before_residual=False, num_layers=1):
    """ids (B, T) target ids; hidden_in (B, T, H) each entry's first-layer input (fc output or a fed-back
    prenorm state), entries at positions 0..T-1 -> (prenorm (B, T, H), logits (B, T, V_d))."""
    pos = torch.arange(ids.shape[1])
    g = rms(hidden_in, w["midlayer.hidden_norm.weight"])
    x = torch.cat([rms(embed.double()[ids], w["midlayer.input_layernorm.weight"]), g], dim=-1)
    h = reference_layer(w, "midlayer.", x, g if norm_before_residual else hidden_in, pos, theta)
    for i in range(1, num_layers):  # plain pre-norm Llama layers over h
        h = reference_layer(w, f"layers.{i}.", rms(h, w[f"layers.{i}.input_layernorm.weight"]), h, pos, theta)
    return h, rms(h, w["norm.weight"]) @ w["lm_head.weight"].T


def reference_fuse(w, aux, norm_before_fc=False):
    """aux (B, T, n*H) -> g (B, T, H): [input_norm, one norm over all n * H (vLLM combine_hidden_states)],
    fc."""
    aux = aux.double()
    if norm_before_fc:
        aux = rms(aux, w["input_norm.weight"])
    return aux @ w["fc.weight"].T


def check_against_reference(
    draft, weights, embed, theta, n_aux=3, norm_before_fc=False, norm_output=False, **options
):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (2, 6), generator=g)
    aux = torch.randn(2, 6, n_aux * HIDDEN, generator=g) * 3
    with torch.no_grad():
        cache = KVCache()
        hidden, logits = draft.step(ids, draft.fuse(aux), torch.arange(6).expand(2, 6), cache)
        guess = draft.to_target_ids(logits[:, -1:].argmax(-1))  # (2, 1)
        _, chained = draft.step(guess, hidden[:, -1:], torch.full((2, 1), 6), cache)
    w = {k: v.double() for k, v in weights.items()}
    g0 = reference_fuse(w, aux, norm_before_fc)
    prenorm, expected = reference_forward(w, embed, ids, g0, theta, **options)
    assert (logits.double() - expected).abs().max().item() <= 1e-5
    # the chained entry: the prefix entries unchanged (causal), then the fed-back prenorm state (norm_output:
    # its final norm, vLLM llama_eagle3.py `aux_output`)
    fed = rms(prenorm[:, -1:], w["norm.weight"]) if norm_output else prenorm[:, -1:]
    hidden_in = torch.cat([g0, fed], dim=1)
    _, ref_chained = reference_forward(w, embed, torch.cat([ids, guess], 1), hidden_in, theta, **options)
    assert (chained.double() - ref_chained[:, -1:]).abs().max().item() <= 1e-5


# ---------------------------------------------------------------- layouts


def test_eagle3_release_bin_without_aux_ids_or_embedding(tmp_path, target):
    """SafeAILab release: pytorch_model.bin, no rope_theta (LlamaConfig default 10000), no aux ids
    (engines' default [2, N//2, N-3]), embedding from the target."""
    weights = layer_weights(0)
    d2t, t2d = random_vocab_map(0)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(),
        "draft_vocab_size": DRAFT_VOCAB,
        "torch_dtype": "float16",
    }
    src = write(tmp_path / "release", config, {**weights, "d2t": d2t, "t2d": t2d}, bin_file=True)
    draft, layout, notes = load_published(src, target=str(target))
    assert layout == "eagle3"
    assert draft.config.aux_layer_ids == [2, TARGET_LAYERS // 2, TARGET_LAYERS - 3]
    assert any("engines' default" in n for n in notes)
    assert torch.equal(draft.d2t, d2t)
    check_against_reference(draft, weights, target_embed(target), 10000.0)


def test_specforge_eagle_config_ids_and_own_embedding(tmp_path, target):
    """SpecForge: ids only in eagle_config (output of layer j -> eyas j + 1), embed_tokens included,
    `model.`-prefixed names accepted."""
    weights = layer_weights(1)
    d2t, t2d = random_vocab_map(1)
    embed = target_embed(target)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(theta=500000.0),
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]},
    }
    tensors = {"model." + k if k.startswith("midlayer.") else k: v for k, v in weights.items()}
    src = write(
        tmp_path / "specforge", config, {**tensors, "d2t": d2t, "t2d": t2d, "embed_tokens.weight": embed}
    )
    draft, layout, _ = load_published(src)
    assert layout == "eagle3" and draft.config.aux_layer_ids == [2, 4, 6]
    assert draft.config.rope_parameters["rope_theta"] == 500000.0
    check_against_reference(draft, weights, embed, 500000.0)


def test_modelopt_export(tmp_path, target):
    """ModelOpt: `layers.0.*`, eagle_config template, d2t without t2d, no embedding."""
    weights = layer_weights(2)
    d2t, t2d = random_vocab_map(2)
    eagle_config = {
        "eagle_aux_hidden_state_layer_ids": [1, 4, 6],
        "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True,
        "use_last_layernorm": True,
        "use_mtp_layernorm": False,
        "next_layer_regular": True,
        "parallel_draft_step": 1,
        "parallel_draft_heads_num_layers": None,
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(theta=10000.0),
        "head_dim": HEAD_DIM,
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_config": eagle_config,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_scaling": None,
    }
    src = write(tmp_path / "modelopt", config, {**renamed(weights, "layers.0."), "d2t": d2t})
    draft, layout, _ = load_published(src, target=str(target))
    assert layout == "modelopt" and draft.config.aux_layer_ids == [2, 5, 7]
    assert torch.equal(draft.t2d, t2d)
    check_against_reference(draft, weights, target_embed(target), 10000.0)


def test_speculators(tmp_path, target):
    """speculators eagle3: nested transformer_layer_config, verifier names the target (embedding)."""
    weights = layer_weights(3)
    d2t, t2d = random_vocab_map(3)
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_fields(theta=20000.0),
        "draft_vocab_size": DRAFT_VOCAB,
        "norm_before_residual": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 6],
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": str(target), "architectures": ["LlamaForCausalLM"]},
        },
    }
    src = write(
        tmp_path / "spec",
        config,
        {
            **renamed(weights, "layers.0."),
            "d2t": d2t,
            "t2d": t2d,
            "verifier_lm_head.weight": torch.zeros(DRAFT_VOCAB, HIDDEN),
        },
    )
    draft, layout, _ = load_published(src)
    assert layout == "speculators" and draft.config.target_model == str(target)
    check_against_reference(draft, weights, target_embed(target), 20000.0)


def test_full_vocab_identity_map_and_target_lm_head(tmp_path, target):
    """No d2t/t2d with draft_vocab_size == vocab_size -> identity; no lm_head -> the target's."""
    from eyas.data.target import load_head_weights

    weights = layer_weights(4, draft_vocab=VOCAB)
    del weights["lm_head.weight"]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(),
        "eagle_aux_hidden_state_layer_ids": [2, 4, 6],
    }
    src = write(tmp_path / "full", config, renamed(weights, "layers.0."))
    out = import_draft(src, tmp_path / "imported", target=str(target))
    draft = load_draft(out)
    assert torch.equal(draft.d2t, torch.zeros(VOCAB, dtype=torch.int64)) and bool(draft.t2d.all())
    heads = load_head_weights(str(target))
    check_against_reference(draft, {**weights, "lm_head.weight": heads["lm_head"]}, heads["embed"], 10000.0)
    meta = json.loads((out / "config.json").read_text())["eyas"]
    assert meta["source_layout"] == "eagle3" and meta["imported_from"] == str(src)


def test_nvidia_v3_shaped(tmp_path, target):
    """nvidia/gpt-oss-120b-Eagle3-v3's shape: ModelOpt names and eagle_config, aux ids as boundaries
    ending at N (the last layer's output, [24, 30, 36] of 36), norm_before_fc in eagle_config with its
    `input_norm.weight` over all 3 * H_t, d2t without t2d, no embedding."""
    ids = [TARGET_LAYERS - 4, TARGET_LAYERS - 2, TARGET_LAYERS]
    weights = layer_weights(11, norm_before_fc=True)
    d2t, t2d = random_vocab_map(11)
    eagle_config = {
        "eagle_aux_hidden_state_layer_ids": ids,
        "norm_before_fc": True,
        "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True,
        "use_last_layernorm": True,
        "use_mtp_layernorm": False,
        "next_layer_regular": True,
        "parallel_draft_step": 1,
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(theta=10000.0),
        "head_dim": HEAD_DIM,
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_config": eagle_config,
    }
    src = write(tmp_path / "v3", config, {**renamed(weights, "layers.0."), "d2t": d2t})
    draft, layout, _ = load_published(src, target=str(target))
    assert layout == "modelopt" and draft.config.aux_layer_ids == ids and draft.config.norm_before_fc
    assert not draft.config.norm_before_residual and draft.config.num_layers == 1
    check_against_reference(draft, weights, target_embed(target), 10000.0, norm_before_fc=True)
    with pytest.raises(AssertionError):  # the reference tells the options apart
        check_against_reference(draft, weights, target_embed(target), 10000.0, norm_before_fc=False)


def test_redhat_v2_shaped(tmp_path, target):
    """RedHatAI/gpt-oss-120b-speculator.eagle3 v2's shape: the speculators format with norm_before_fc
    (`input_norm.weight`) and norm_before_residual, its own copy of the embedding, the trainer's
    verifier head left in."""
    weights = layer_weights(12, norm_before_fc=True)
    d2t, t2d = random_vocab_map(12)
    embed = target_embed(target)
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_fields(theta=150000.0),
        "draft_vocab_size": DRAFT_VOCAB,
        "norm_before_residual": True,
        "norm_before_fc": True,
        "target_hidden_size": HIDDEN,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": str(target), "architectures": ["LlamaForCausalLM"]},
        },
    }
    src = write(
        tmp_path / "redhat",
        config,
        {
            **renamed(weights, "layers.0."),
            "d2t": d2t,
            "t2d": t2d,
            "embed_tokens.weight": embed,
            "verifier_lm_head.weight": torch.zeros(DRAFT_VOCAB, HIDDEN),
            "verifier_norm.weight": torch.ones(HIDDEN),
        },
    )
    draft, layout, _ = load_published(src)
    assert layout == "speculators" and draft.config.norm_before_fc and draft.config.norm_before_residual
    check_against_reference(draft, weights, embed, 150000.0, norm_before_fc=True, norm_before_residual=True)
    with pytest.raises(AssertionError):
        check_against_reference(draft, weights, embed, 150000.0, norm_before_fc=True)


def test_speculators_trainer_defaults_with_norm_output(tmp_path, target):
    """What `speculators train` 0.9 writes by default: norm_before_fc, norm_before_residual and norm_output
    (the next step's h is the final norm's output, vLLM llama_eagle3.py `aux_output`), embedding included."""
    weights = layer_weights(15, norm_before_fc=True)
    d2t, t2d = random_vocab_map(15)
    embed = target_embed(target)
    config = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_fields(),
        "draft_vocab_size": DRAFT_VOCAB,
        "norm_before_residual": True,
        "norm_before_fc": True,
        "norm_output": True,
        "fc_norm": False,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
    }
    tensors = {**renamed(weights, "layers.0."), "d2t": d2t, "t2d": t2d, "embed_tokens.weight": embed}
    draft, layout, _ = load_published(write(tmp_path / "spec09", config, tensors), target=str(target))
    assert layout == "speculators" and draft.config.norm_output
    options = {"norm_before_fc": True, "norm_before_residual": True}
    check_against_reference(draft, weights, embed, 10000.0, norm_output=True, **options)
    with pytest.raises(AssertionError):  # the reference tells the fed-back states apart
        check_against_reference(draft, weights, embed, 10000.0, **options)


@pytest.mark.parametrize("layout", ["eagle3", "speculators"])
def test_several_layers_and_four_aux_states(tmp_path, target, layout):
    """num_hidden_layers 3 (vLLM PR #26164): the release layout's `midlayer.*` + `layers.1.*`, `layers.2.*`,
    the speculators layout's `layers.0..2.*`; four aux states."""
    weights = layer_weights(13, n_aux=4, num_layers=3)
    d2t, t2d = random_vocab_map(13)
    fields = {**llama_fields(), "num_hidden_layers": 3}
    if layout == "eagle3":
        config = {
            "architectures": ["LlamaForCausalLMEagle3"],
            **fields,
            "draft_vocab_size": DRAFT_VOCAB,
            "eagle_aux_hidden_state_layer_ids": [2, 4, 6, 8],
        }
        tensors = weights
    else:
        config = {
            "speculators_model_type": "eagle3",
            "transformer_layer_config": fields,
            "draft_vocab_size": DRAFT_VOCAB,
            "norm_before_residual": False,
            "eagle_aux_hidden_state_layer_ids": [2, 4, 6, 8],
        }
        tensors = renamed(weights, "layers.0.")
    src = write(tmp_path / layout, config, {**tensors, "d2t": d2t, "t2d": t2d})
    draft, _, _ = load_published(src, target=str(target))
    assert draft.config.num_layers == 3 and draft.config.aux_layer_ids == [2, 4, 6, 8]
    check_against_reference(draft, weights, target_embed(target), 10000.0, n_aux=4, num_layers=3)


def test_release_layout_with_norm_before_residual(tmp_path, target):
    weights = layer_weights(14)
    d2t, t2d = random_vocab_map(14)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(),
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 6],
        "norm_before_residual": True,
    }
    draft, _, _ = load_published(
        write(tmp_path / "nbr", config, {**weights, "d2t": d2t, "t2d": t2d}), target=str(target)
    )
    check_against_reference(draft, weights, target_embed(target), 10000.0, norm_before_residual=True)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda c, t: c.update(fc_norm=True), "fc_norm"),
        (lambda c, t: c.update(num_hidden_layers=2), r"missing tensors \['layers.1"),
        (lambda c, t: c.update(model_type="qwen3"), "model_type 'qwen3'"),
        (
            lambda c, t: c["eagle_config"].update(use_input_layernorm_in_first_layer=False),
            "use_input_layernorm_in_first_layer",
        ),
        (
            lambda c, t: t.update({"layers.1.norm.weight": torch.ones(HIDDEN)}),
            "does not have: \\['layers.1.norm",
        ),
        (
            lambda c, t: t.update({"input_norm.weight": torch.ones(3 * HIDDEN)}),
            "does not have: \\['input_norm",
        ),
        (lambda c, t: c.update(norm_before_fc=True), r"missing tensors \['input_norm.weight'\]"),
        (lambda c, t: t.pop("d2t"), "no d2t"),
    ],
)
def test_unsupported_features_refused_by_name(tmp_path, target, change, message):
    weights = layer_weights(5)
    d2t, t2d = random_vocab_map(5)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(),
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 6],
        "eagle_config": {},
    }
    tensors = {**renamed(weights, "layers.0."), "d2t": d2t, "t2d": t2d}
    change(config, tensors)
    src = write(tmp_path / "bad", config, tensors)
    with pytest.raises(DraftFormatError, match=message):
        load_published(src, target=str(target))


def test_speculators_without_norm_before_residual_is_ambiguous(tmp_path, target):
    config = {
        "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_fields(),
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 6],
    }
    d2t, t2d = random_vocab_map(6)
    src = write(tmp_path / "spec", config, {**renamed(layer_weights(6), "layers.0."), "d2t": d2t, "t2d": t2d})
    with pytest.raises(DraftFormatError, match="vLLM assumes true"):
        load_published(src, target=str(target))


def test_cli(tmp_path, target, capsys):
    d2t, t2d = random_vocab_map(8)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_fields(),
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 6],
    }
    src = write(tmp_path / "src", config, {**layer_weights(8), "d2t": d2t, "t2d": t2d})
    assert main_import([str(src), "--out", str(tmp_path / "out"), "--target", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    assert load_draft(tmp_path / "out").config.target_model == str(target)
    assert main(["import", str(src), "--out", str(tmp_path / "out2")]) == 2  # embedding needs a target
    assert "no embed_tokens.weight in the draft and no target" in capsys.readouterr().err
