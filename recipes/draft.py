"""The recipe's `draft` section: one class a kind, picked by `draft.kind` (a pydantic union discriminated by
it). The keys every kind reads are `DraftSection` here; a kind's own keys are its class in its home,
`train/kinds/<name>/recipe.py`, named by the registry (DraftKind.draft_section), so that a key one kind
lacks is an unknown key for it (`draft.block_size` on an EAGLE-3 draft) and adding a kind touches no file
here.

    DraftSection          the keys of every kind: widths, num_layers, lm_head, init_from
    Eagle3LayerSection    + EAGLE-3's layer options (eagle3, and peagle, which runs the same layer)
    a kind's class        + its own: `kind` (a Literal of its name), P-EAGLE's and DFlash's mask token, ...
"""

from __future__ import annotations

import importlib
import typing
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag

from eyas.recipes.types import Num, Section
from eyas.train.kinds import DEFAULT_KIND, KINDS


class DraftSection(Section):
    intermediate_size: int | None = Field(None, ge=1, description="MLP width (null: the target's)")
    num_attention_heads: int | None = Field(None, ge=1, description="attention heads (null: the target's)")
    num_key_value_heads: int | None = Field(None, ge=1, description="key/value heads (null: the target's)")
    head_dim: int | None = Field(None, ge=1, description="attention head size (null: the target's)")
    rms_norm_eps: Num | None = Field(None, description="the RMSNorms' epsilon (null: the target's)")
    init_from: str | None = Field(None, description="an eyas checkpoint to warm-start from")
    num_layers: int = Field(1, ge=1, description="decoder layers")
    lm_head: Literal["random", "target", "target_frozen"] = Field(
        "random",
        description="lm_head init: random (EAGLE-3, SpecForge); the target's lm_head rows of the draft "
        "vocab, trained (target) or frozen (target_frozen, speculators)",
    )


class Eagle3LayerSection(DraftSection):
    """EAGLE-3's decoder layer and its options (vLLM's llama_eagle3.py)."""

    norm_before_fc: bool = Field(False, description="one RMSNorm over the concatenated aux states before fc")
    norm_before_residual: bool = Field(False, description="first layer: the residual is hidden_norm(h)")
    sliding_window: int | None = Field(
        None,
        ge=2,
        description="attend over the last this many positions only, in training, eyas's loop and the "
        "export (vLLM reads it; SGLang and TensorRT-LLM exports are refused); null: full attention",
    )
    norm_output: bool = Field(
        False,
        description="the next TTT / draft step's h is the final norm's output (speculators' default; no "
        "effect on draft.kind peagle, which feeds no output back)",
    )


def kind_field(name: str) -> Any:
    """A kind class's `kind` field: its own name, the one value that picks it."""
    choices = "; ".join(f"{n}: {k.summary.split(': ', 1)[1]}" for n, k in KINDS.items())
    return Field(name, description=f"the draft kind (train/kinds/): {choices}")


def _section_class(name: str) -> type[DraftSection]:
    module, _, attr = KINDS[name].draft_section.partition(":")
    return getattr(importlib.import_module(module), attr)  # by name, as the registry loads a kind's core


SECTIONS: dict[str, type[DraftSection]] = {name: _section_class(name) for name in KINDS}


def _kind_of(v: Any) -> str:
    return v.get("kind", DEFAULT_KIND) if isinstance(v, dict) else getattr(v, "kind", DEFAULT_KIND)


def _tag(v: Any) -> str | None:
    """The union's tag for a draft section: `|` + its kind (a tag recipes/load.py leaves out of a key's
    name, as `either`'s), None for a kind no class is (the error below)."""
    return f"|{_kind_of(v)}" if _kind_of(v) in SECTIONS else None


def _drop_other_kinds_unset(v: Any) -> Any:
    """A recipe.yaml saved before each kind had its own section lists every kind's keys, another kind's at
    null or false: those are dropped (a key no kind has, or another kind's key set, stays an error)."""
    if not isinstance(v, dict) or _kind_of(v) not in SECTIONS:
        return v
    mine = SECTIONS[_kind_of(v)].model_fields
    others = {k for c in SECTIONS.values() for k in c.model_fields} - set(mine)
    return {k: x for k, x in v.items() if not (k in others and x in (None, False))}


AnyDraftSection = Annotated[
    typing.Union[tuple(Annotated[c, Tag(f"|{n}")] for n, c in SECTIONS.items())],  # noqa: UP007
    Discriminator(
        _tag,
        custom_error_type="draft_kind",
        custom_error_message=f"draft.kind: must be {' | '.join(SECTIONS)}",
    ),
    BeforeValidator(_drop_other_kinds_unset),
]
