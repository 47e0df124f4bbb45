"""What eyas's serving loop holds while it evaluates (`eyas eval`), as `eyas plan` prices it and
benchmarks/bench_long_prompt.py measures it: the weights, the KV caches and the peak of one prefill forward.

    weights       the target as the loop holds it (eval.target_dtype) and the draft but its embedding
    kv            per request in flight: the slots the loop's caches reserve when it joins (engine.py: its
                  prompt and max_tokens, a round's speculative entries; every layer keeps every entry,
                  sliding ones included: serve/decoding/cache.py) x (the target's layers x 2 x KV heads x
                  head_dim + the draft's, KV heads only) x element bytes
    kv_growth     while a longer request grows the caches, the old buffers are held with the new ones: up to
                  the KV's size again (a loop whose requests all fit the first reservation never grows)
    activations   one prefill forward of eval.prefill_tokens tokens against the whole context:
                    masks       the bool masks the loop builds (serve/decoding/masks.py: the full and the
                                sliding one, the scatter's copy, the window test): 4 x tokens x context bytes
                    attention   eval.attention_block_mb of scores where the target's attention is eager
                                (gpt-oss: train/blocked_attention.py); SDPA's kernels keep no scores
                    per token   the decoder layer's live tensors (residual, norms, q/k/v, attention
                                output, and for an MoE each of its top-k experts' gathered input,
                                gate/up, gate and down projection: per_token_bytes), the aux states the
                                draft reads, the draft layer's own
                    logits      the last position's, per request, in the dtype and in fp32

The context a request is planned at: the longest of data.max_prompt_tokens and train.max_length (the
longest sequence the draft is trained on), plus eval.max_new_tokens, at most the target's context; requests in
flight: the largest eval.concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eyas.recipes.defaults import spare_slots

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from eyas.recipes.schema import Recipe
    from eyas.train.kinds.config import DraftConfig


@dataclass
class EvalMemory:
    context: int  # tokens per request
    rows: int  # requests in flight
    weights: float  # bytes
    kv: float
    kv_growth: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.kv_growth + self.activations


def eval_context(recipe: Recipe, cfg: PretrainedConfig) -> int:
    """The tokens of context the plan gives each request (module docstring)."""
    longest = max(recipe.data.max_prompt_tokens or 0, recipe.train.max_length) + recipe.eval.max_new_tokens
    return min(longest, getattr(cfg, "max_position_embeddings", None) or longest)


def head_dim(cfg: PretrainedConfig) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def kv_bytes_per_slot(cfg: PretrainedConfig, draft: DraftConfig, element: int) -> int:
    """One slot of every layer's keys and values: the target's and the draft's."""
    target = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim(cfg)
    return (target + draft.num_layers * 2 * draft.num_key_value_heads * draft.head_dim) * element


def per_token_bytes(cfg: PretrainedConfig, draft: DraftConfig, element: int) -> int:
    """The live tensors of one prefill token (module docstring): the target's decoder layer, the aux states,
    the draft's layer. An MoE layer (transformers' grouped_mm experts, its default) holds, for each of the
    token's top-k experts, its gathered input (H), gate/up with its gathered bias (2 x 2I), the gate's
    temporaries (4I) and the down projection with its bias and weighting (3H); a dense MLP, gate/up/down."""
    aux = len(draft.aux_layer_ids) * draft.target_hidden_size * element
    draft_layer = (8 * draft.hidden_size + 3 * draft.intermediate_size) * element
    return layer_token_bytes(cfg, element) + aux + draft_layer


def layer_token_bytes(cfg: PretrainedConfig, element: int) -> int:
    """The live tensors of one token in the target's decoder layer (per_token_bytes)."""
    H = cfg.hidden_size
    qkv = (cfg.num_attention_heads * 2 + 2 * cfg.num_key_value_heads) * head_dim(cfg)  # q, attn out, k, v
    topk = getattr(cfg, "num_experts_per_tok", 0)
    mlp = topk * (4 * H + 8 * cfg.intermediate_size) if topk else 3 * cfg.intermediate_size + H
    return (6 * H + qkv + mlp) * element


def eval_memory(
    recipe: Recipe, cfg: PretrainedConfig, draft: DraftConfig, weights: float, element: int
) -> EvalMemory:
    """The plan's eval memory (module docstring); `weights`: the target's and the draft's bytes as held."""
    ev = recipe.eval
    context, rows = eval_context(recipe, cfg), max(ev.concurrency)
    spare = spare_slots(ev.k + 1, ev.k, 1)  # a chain's speculative entries past the context
    kv = rows * (context + spare) * kv_bytes_per_slot(cfg, draft, element)
    tokens = min(ev.prefill_tokens, rows * context)
    eager = getattr(cfg, "model_type", "") == "gpt_oss"  # sinks: no SDPA, blocked eager attention
    activations = (
        4 * tokens * context
        + (ev.attention_block_mb << 20 if eager else 0)
        + tokens * per_token_bytes(cfg, draft, element)
        + rows * (cfg.vocab_size * (element + 4) + draft.draft_vocab_size * 4)
    )
    return EvalMemory(context, rows, weights, float(kv), float(kv), float(activations))
