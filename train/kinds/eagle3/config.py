"""EAGLE-3's checkpoint config (`Eagle3Config`): DraftConfig's fields and its decoder layer's options (vLLM's
llama_eagle3.py reads them from the export's config.json). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DraftConfig


@dataclass
class Eagle3Config(DraftConfig):
    kind: str = "eagle3"
    norm_before_fc: bool = False  # RMSNorm `input_norm` over the concatenated aux states before fc
    norm_before_residual: bool = False  # first layer: residual = hidden_norm(h) instead of h
    norm_output: bool = False  # the next step's h is norm(h_out) instead of h_out
    # attention over the last `sliding_window` positions only (a query at position p sees keys at p - W + 1
    # .. p, as transformers' and vLLM's windows); None: all of them
    sliding_window: int | None = None
