"""EAGLE-3: a chain (or tree) of draft forwards, one a drafted token, trained with training-time test.

Its torch half is the project's base draft: `Eagle3Draft` (train/model.py) and `ttt_forward` (train/ttt.py),
which P-EAGLE and DFlash build on, so `core` names this folder's core.py, which reads them from there.
"""

from __future__ import annotations

from ..base import DraftKind
from .config import Eagle3Config


class Eagle3(DraftKind):
    name = "eagle3"
    summary = "EAGLE-3: one draft forward per drafted token (TTT)"
    core = "eyas.train.kinds.eagle3.core"
    draft_section = "eyas.train.kinds.eagle3.recipe:Eagle3Section"  # its recipe `draft` keys
    config_class = Eagle3Config
    card_title = "An EAGLE-3 speculative-decoding draft head"
    card_layout = "EAGLE-3 release layout (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`)"
    card_aux = "vLLM reads the aux layers from `eagle_aux_hidden_state_layer_ids` in this repo's config.json."


EAGLE3 = Eagle3()
