"""EAGLE-3's `draft` section of a recipe (recipes/draft.py): the EAGLE-3 layer's options, nothing more."""

from typing import Literal

from eyas.recipes.draft import Eagle3LayerSection, kind_field


class Eagle3Section(Eagle3LayerSection):
    kind: Literal["eagle3"] = kind_field("eagle3")
