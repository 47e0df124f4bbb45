"""P-EAGLE's checkpoint config (`PEagleConfig`): EAGLE-3's layer and options, and the mask slots' token.
Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from ..eagle3.config import Eagle3Config


@dataclass
class PEagleConfig(Eagle3Config):
    kind: str = "peagle"
    # the input token of the mask slots (vLLM's pard_token); the trainer sets it (train/trainer.py mask_token)
    mask_token_id: int | None = None
