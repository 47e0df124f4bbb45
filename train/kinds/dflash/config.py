"""DFlash's checkpoint config (`DFlashConfig`): DraftConfig's fields and its block's (Qwen3 layers, so none
of EAGLE-3's layer options). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DraftConfig


@dataclass
class DFlashConfig(DraftConfig):
    kind: str = "dflash"
    # the input token of the mask slots (vLLM's dflash_config.mask_token_id); the trainer sets it
    mask_token_id: int | None = None
    # the slots of a block (the anchor and block_size - 1 mask slots; core.py)
    block_size: int | None = None
    # q/k/v/o projections with a bias (z-lab's gpt-oss drafts; vLLM qwen3_dflash attention_bias)
    attention_bias: bool = False
