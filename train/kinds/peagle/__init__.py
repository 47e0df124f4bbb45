"""P-EAGLE: all K drafts of a round from one draft forward (mask slots), trained with COD sampling.

The model and its unroll are core.py (`PEagleDraft`, `cod_forward`); what the rest of eyas asks of the kind
is `PEagle` below (the interface: train/kinds/base.py).
"""

from __future__ import annotations

from ..base import DraftKind
from .config import PEagleConfig

# a published draft's mask token, in the order vLLM 0.32's llm_base_proposer reads it
MASK_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")


def mask_token_of(raw: dict) -> int | None:
    """A published draft config's mask token; None: not a parallel draft."""
    return next((raw[k] for k in MASK_KEYS if raw.get(k) is not None), None)


def cod_share(d: int, ratio: float, floor: float) -> float:
    """The share of the counted positions depth d keeps: max(ratio**d, floor) (depth 0: all)."""
    return max(ratio**d, floor)


class PEagle(DraftKind):
    name = "peagle"
    summary = "P-EAGLE: all K drafts from one forward (COD-sampled depths)"
    core = "eyas.train.kinds.peagle.core"
    draft_section = "eyas.train.kinds.peagle.recipe:PEagleSection"  # its recipe `draft` keys
    config_class = PEagleConfig
    chains_only = True
    feeds_output_back = False  # one forward a round: norm_output has no effect (vLLM's loader drops it)
    mask_slots = True
    # (its own draft key, mask_token_id, is its section's: recipe.py)
    proposal = "eyas.train.kinds.peagle.loop:propose_parallel"
    engines = ("vllm",)
    speculators_type = "peagle"  # vLLM's update_peagle: mask_token_id -> pard_token, parallel_drafting
    card_title = "A P-EAGLE (parallel drafting) speculative-decoding draft head"
    card_layout = (
        "EAGLE-3 release layout (`fc`, `midlayer.*`, `mask_hidden`, `norm`, `lm_head`, `d2t`, `t2d`)"
    )
    card_aux = (
        "vLLM reads the aux layers from `eagle_aux_hidden_state_layer_ids` in this repo's config.json, "
        "and the mask slots' token from `mask_token_id`."
    )

    def options(self, tr) -> dict:
        # COD sampling, drawn per row from its tokens and the epoch (train/trainer.py reseed)
        return {"cod": (tr.cod_ratio, tr.cod_floor), "cod_seed": (tr.seed, 0)}

    def untrained_k(self, trained: list[int] | None, k: int) -> str | None:
        if trained is None or k in trained:
            return None
        t = max(trained)
        why = f"this P-EAGLE draft trained {t} depths (train.ttt_steps={t}); a depth past them is untrained"
        return f"k={k}: {why}: serve k <= {t}"

    def check_recipe(self, recipe, check) -> None:
        t = recipe.train.ttt_steps
        depths = f"train.ttt_steps={t}: P-EAGLE trains depths 0..ttt_steps-1, and needs a mask slot (>= 2)"
        check(t >= 2, "train.ttt_steps", depths)

    def draft_forwards(self, shape) -> int:
        return min(shape.steps, 2)  # the step over the accepted path, then the mask slots' forward

    flops_priced_training = False  # its training rate stays per token in eyas plan --run

    def unrolled(self, tr) -> float:
        # depth 0 over every position, depth d over COD's share of them (core.py)
        return 1.0 + sum(cod_share(d, tr.cod_ratio, tr.cod_floor) for d in range(1, tr.ttt_steps))

    def on_grid(self, tr) -> float:
        return sum(1 - cod_share(d, tr.cod_ratio, tr.cod_floor) for d in range(1, tr.ttt_steps))

    def loss_rows(self, tr) -> tuple[bool, float]:
        # depth 0 over every position; depth d over its kept anchors, gathered (core.py): depth 1 keeps most
        return True, (cod_share(1, tr.cod_ratio, tr.cod_floor) if tr.ttt_steps > 1 else 0.0)

    def plan_note(self, tr, unrolled: float) -> str:
        return (
            f"x {unrolled:.2f} steps' worth + {self.on_grid(tr):.2f} depths' attention and loss on the "
            f"(B, T) grid (P-EAGLE: {tr.ttt_steps} depths, COD {tr.cod_ratio:g} / {tr.cod_floor:g})"
        )

    def vllm_config(self, model: str, k: int) -> dict:
        # without parallel_drafting vLLM skips mask_hidden and chains the head (low acceptance)
        return {**super().vllm_config(model, k), "parallel_drafting": True}

    def published(self, raw: dict) -> bool:
        """speculators' `peagle`, or the EAGLE-3 layout with a mask token (a speculators config of another
        type that writes one, DFlash's, is not P-EAGLE's)."""
        layout = raw.get("speculators_model_type")
        return layout == self.speculators_type if layout else mask_token_of(raw) is not None

    def parallel_keys(self, cfg) -> dict:
        # vLLM 0.32's llm_base_proposer reads mask_token_id (then pard_token) for the mask slots
        return {"mask_token_id": cfg.mask_token_id, "pard_token": cfg.mask_token_id}

    def engine_problem(self, engine_label: str) -> str:
        return (
            f"draft kind peagle (parallel drafting): {engine_label}'s EAGLE-3 worker drafts one token per "
            "forward and reads no mask_hidden; serve it with vLLM (parallel_drafting, vLLM 0.32 "
            "llama_eagle3.py)"
        )


PEAGLE = PEagle()
