"""DFlash's `draft` section of a recipe (recipes/draft.py): its block, mask token and layers (Qwen3's, so
none of EAGLE-3's layer options)."""

from typing import Literal

from pydantic import Field

from eyas.recipes.draft import DraftSection, kind_field


class DFlashSection(DraftSection):
    kind: Literal["dflash"] = kind_field("dflash")
    num_layers: int = Field(5, ge=1, description="decoder layers (speculators 0.9.0's DFlash default)")
    mask_token_id: int | None = Field(
        None,
        ge=0,
        description="the mask slots' input token (vLLM's dflash_config.mask_token_id); null: the target's "
        "pad token, else its vocabulary's last id",
    )
    block_size: int | None = Field(
        None,
        ge=2,
        description="the block, the anchor and block_size - 1 mask slots (drafts per round); null: "
        "train.ttt_steps + 1 when that is given, else 16 (speculators 0.9.0's DFlash default). "
        "train.ttt_steps follows it (block_size - 1)",
    )
    attention_bias: bool = Field(
        False, description="q/k/v/o projections with a bias (z-lab's gpt-oss DFlash drafts have one)"
    )
