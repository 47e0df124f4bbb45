"""`eyas recipe-keys [SECTION]`: every recipe key with its type, default and description.

Nothing here is listed by hand: the keys, types, defaults and descriptions are read from the pydantic models
in recipes/schema.py, so the listing is what the schema accepts. A list of mappings (`data.prompts` in its
list form) has its keys listed as `data.prompts[].KEY`.
"""

import argparse
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from eyas.recipes.draft import SECTIONS
from eyas.recipes.schema import Recipe
from eyas.recipes.types import inner_model
from eyas.train.kinds import DEFAULT_KIND


def type_name(tp: Any) -> str:
    """`int`, `float | None`, `list[int]`, `auto | cpu` (a Literal's choices), `str | list[PromptSource]`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def default_text(info: FieldInfo) -> str:
    """`default 7`, `default null`, `default [0.0]` (as YAML writes it), or `required`."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6)
    return "default " + text.removesuffix("...\n").strip()


def key_lines(model: type[BaseModel] = Recipe, prefix: str = "") -> Iterator[str]:
    """`section.key  (type, default X)  description` for every key under `model`, in the schema's order.
    A section is not a key itself: its keys follow under its name; the draft section's, one class a kind,
    each once, a key only some kinds have saying which (`[dflash]`)."""
    for name, info in model.model_fields.items():
        inner = inner_model(info.annotation)
        if name == "draft" and model is Recipe:
            yield from draft_key_lines(f"{prefix}{name}.")
            continue
        if inner is not None and inner is info.annotation:  # a section
            yield from key_lines(inner, f"{prefix}{name}.")
            continue
        yield f"{prefix}{name}  ({type_name(info.annotation)}, {default_text(info)})  {info.description}"
        if inner is not None:  # a list of mappings: their keys
            yield from key_lines(inner, f"{prefix}{name}[].")


def draft_key_lines(prefix: str) -> Iterator[str]:
    """The draft section's keys over every kind's class (recipes/draft.py): `kind` first with every kind's
    name, then each key in the order the kinds list it, with the kinds it holds for where not all (a key
    whose default differs by kind, DFlash's num_layers, once a default)."""
    seen: dict[tuple[str, str], list[str]] = {}
    kind_line = f"{prefix}kind  ({' | '.join(SECTIONS)}, default {DEFAULT_KIND})"
    for kind, cls in SECTIONS.items():
        for line in key_lines(cls, prefix):
            key, rest = line.split("  ", 1)
            if key == f"{prefix}kind":
                line = f"{kind_line}  {rest.split(')  ', 1)[1]}"
            seen.setdefault((key, line), []).append(kind)
    ordered = sorted(seen.items(), key=lambda kv: kv[0][0] != f"{prefix}kind")  # stable: kind first
    for (key, line), kinds in ordered:
        if len(kinds) == len(SECTIONS):
            yield line
        else:
            yield f"{key}  [draft.kind {', '.join(kinds)}] {line.split('  ', 1)[1]}"


def main_recipe_keys(argv: list[str]) -> int:
    sections = list(Recipe.model_fields)
    p = argparse.ArgumentParser(
        prog="eyas recipe-keys",
        description="Every recipe key with its type, default and description (from recipes/schema.py).",
    )
    p.add_argument("section", nargs="?", choices=sections, help="only this section's keys")
    args = p.parse_args(argv)
    for line in key_lines():
        if args.section in (None, line.split("  ", 1)[0].split(".", 1)[0]):
            print(line)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main_recipe_keys(sys.argv[1:]))
