"""What an offline capture on the hf backend holds while it runs (data/capture.py), as `eyas plan` prices it:

    weights    the target as transformers holds it (stage_memory.py's `held`: on a CPU in the dtype the host
               computes in, data/target.py pick_dtype). Read through mmap where the checkpoint's dtype is the
               one computed in, so counted as the file's pages, not the process's anonymous memory: they are
               read at every forward and must stay resident either way
    shard      on a CPU, one shard's rows, packed as they come (data/shards.py ShardBuffer:
               shard_buffer_bytes)
    moment     the larger of two:
                 check     the first batch's lm_head check (data/capture.py check_final):
                           VERIFY_SEQUENCES x VERIFY_TOKENS positions of full-vocabulary logits, four of them
                           in fp32 at once (the logits, lm_head(final), their difference, its real positions)
                 forward   the longest batch's forward, capture.batch_size x its longest sequence, each token
                           holding the decoder layer's live tensors (eval_memory.layer_token_bytes), the aux
                           states the tap collects, and the previous batch's states, which stay bound into the
                           next forward: the tap's inputs, their concatenation and the final state in the
                           compute dtype, and the stored row (capture_bytes_per_token)

Measured on a 2-core AVX2 EPYC (float32 target, Qwen2.5-Coder-1.5B, 8 sequences of up to 704 tokens): the
check 1.2 GB, the forward 0.8 GB, the previous batch's states 0.3 GB (docs/benchmarks.md, "A 1.5B target from
packages").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eyas.data.capture import VERIFY_SEQUENCES, VERIFY_TOKENS
from eyas.plan.eval_memory import layer_token_bytes

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from eyas.recipes.schema import Recipe

CHECK_COPIES = 4  # fp32 (VERIFY_SEQUENCES, VERIFY_TOKENS, V) tensors check_final holds at once


@dataclass
class CaptureMemory:
    weights: float  # bytes
    shard: float
    check: float
    forward: float
    rows: int  # the longest batch: capture.batch_size sequences
    longest: float  # of this many tokens

    @property
    def total(self) -> float:
        return self.weights + self.shard + max(self.check, self.forward)


def capture_memory(
    recipe: Recipe,
    cfg: PretrainedConfig,
    n_aux: int,
    weights: float,
    element: int,
    longest: float,
    stored_per_token: int,
    shard: float,
) -> CaptureMemory:
    """The plan's capture memory (module docstring): `weights` as held, `element` bytes of the dtype the
    target computes in, `longest` the longest sequence's tokens, `stored_per_token` the stored bytes a token,
    `shard` the host's shard buffer (0 where not counted)."""
    H = cfg.hidden_size
    check = CHECK_COPIES * min(VERIFY_SEQUENCES, recipe.capture.batch_size) * min(VERIFY_TOKENS, longest)
    per_token = layer_token_bytes(cfg, element) + (3 * n_aux + 1) * H * element + stored_per_token
    forward = recipe.capture.batch_size * longest * per_token
    return CaptureMemory(
        weights, shard, float(check * cfg.vocab_size * 4), float(forward), recipe.capture.batch_size, longest
    )
