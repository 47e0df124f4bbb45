"""The demo target's architecture: transformers' own `GptOssForCausalLM`, in miniature.

Everything gpt-oss-120b has that a draft head or a speculative decoder must cope with is here:
a mixture of experts (top-2 of 8 local experts per token), attention sinks, grouped-query
attention, and alternating sliding-window / full attention layers, with a window (32 tokens)
shorter than a typical conversation, so the sliding layers really do forget the question.

Its config.json has the form of gpt-oss-120b's wherever an engine reads it, so the stock vLLM
(`vllm/model_executor/models/gpt_oss.py`) loads it unmodified: YaRN RoPE with every key vLLM reads
(`factor`, `original_max_position_embeddings`, `beta_fast`, `beta_slow`, `truncate`; gpt-oss-120b:
theta 150000, factor 32 over 4096 positions, beta 32 / 1, truncate false; here factor 4 over 512
positions, so 2048 = max_position_embeddings, as 32 * 4096 = 131072 there), sliding window on the
even layers (vLLM applies it by `layer_idx % 2 == 0`, transformers by `layer_types`), attention
sinks, biased q/k/v/o and router, SwiGLU with alpha 1.702 and limit 7.0, RMSNorm eps 1e-5, and a
head_dim (32) that vLLM's CPU attention kernels support.
"""

from __future__ import annotations

import torch
from transformers import GptOssConfig, GptOssForCausalLM

ARCHITECTURE = dict(
    num_hidden_layers=4,  # layer_types default: sliding, full, sliding, full; aux ids [1, 2, 3]
    hidden_size=128,
    intermediate_size=128,  # per expert
    num_local_experts=8,
    num_experts_per_tok=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    sliding_window=32,
    max_position_embeddings=2048,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 512,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
    },
    tie_word_embeddings=False,
)


def demo_config(tokenizer) -> GptOssConfig:
    """The demo architecture sized to `tokenizer`, with its bos/eos/pad ids (eos = `<|return|>`)."""
    return GptOssConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **ARCHITECTURE,
    )


def init_model(tokenizer, seed: int) -> GptOssForCausalLM:
    """A freshly initialised float32 demo target (deterministic in `seed`)."""
    torch.manual_seed(seed)
    return GptOssForCausalLM(demo_config(tokenizer)).float()
