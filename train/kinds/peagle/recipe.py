"""P-EAGLE's `draft` section of a recipe (recipes/draft.py): EAGLE-3's layer and the mask slots' token."""

from typing import Literal

from pydantic import Field

from eyas.recipes.draft import Eagle3LayerSection, kind_field


class PEagleSection(Eagle3LayerSection):
    kind: Literal["peagle"] = kind_field("peagle")
    mask_token_id: int | None = Field(
        None,
        ge=0,
        description="the mask slots' input token (vLLM's pard_token); null: the target's pad token, else its "
        "vocabulary's last id",
    )
