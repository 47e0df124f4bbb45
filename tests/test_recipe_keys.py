"""`eyas recipe-keys`: every key of every section, with its default and description, read from the schema."""

import pytest
from pydantic import BaseModel

from eyas.recipes.draft import SECTIONS
from eyas.recipes.keys import default_text, main_recipe_keys
from eyas.recipes.schema import PromptSource, Recipe
from eyas.recipes.types import inner_model


def every_key() -> list[tuple[str, type[BaseModel], str]]:
    """(printed key, model, field) for every field of every section, the draft section's of every kind's
    class (recipes/draft.py); PromptSource's as data.prompts[].KEY."""
    keys = []
    for section, info in Recipe.model_fields.items():
        models = list(SECTIONS.values()) if section == "draft" else [inner_model(info.annotation)]
        if models[0] is None:
            keys.append((section, Recipe, section))
            continue
        keys += [(f"{section}.{name}", model, name) for model in models for name in model.model_fields]
    keys += [(f"data.prompts[].{name}", PromptSource, name) for name in PromptSource.model_fields]
    return keys


def listing(capsys, *argv: str) -> dict[str, str]:
    """{key: its line} (a draft key whose default or description differs by kind: its last line)."""
    return {line.split("  ", 1)[0]: line for line in lines(capsys, *argv)}


def lines(capsys, *argv: str) -> list[str]:
    assert main_recipe_keys(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


def test_every_key_has_its_default_and_a_description(capsys):
    printed = lines(capsys)
    keys = every_key()
    assert len(keys) > 80 and {p.split("  ", 1)[0] for p in printed} == {key for key, _, _ in keys}
    for key, model, name in keys:
        info = model.model_fields[name]
        assert info.description and info.description.strip(), f"{key} has no description"
        if key == "draft.kind":  # one line: every kind's name
            continue
        # a draft key only some kinds have: `[draft.kind a, b] ` before its type (the kind of `model`)
        kind = getattr(model.model_fields.get("kind"), "default", None)
        ok = [
            p
            for p in printed
            if p.split("  ")[0] == key
            and p.split("  ")[1].rsplit("] ", 1)[-1].endswith(f", {default_text(info)})")
            and p.split("  ")[2] == info.description
            and (not p.split("  ")[1].startswith("[") or kind in p.split("  ")[1].split("]")[0])
        ]
        assert len(ok) == 1, (key, kind)
    assert printed.count(next(p for p in printed if p.startswith("draft.kind  "))) == 1
    assert next(p for p in printed if p.startswith("draft.kind  ")).startswith(
        "draft.kind  (eagle3 | peagle | dflash, default eagle3)"
    )
    assert "draft.block_size  [draft.kind dflash] (int | None, default null)" in "\n".join(printed)
    printed = listing(capsys)
    ttt = Recipe.model_fields["train"].annotation.model_fields["ttt_steps"].description
    assert printed["train.ttt_steps"] == f"train.ttt_steps  (int, default 7)  {ttt}"
    assert "(auto | float32 | bfloat16 | float16, default auto)" in printed["target.dtype"]
    assert "(list[float], default [0.0])" in printed["eval.temperature"]
    assert "(str | None, default null)" in printed["draft.init_from"]
    assert "(str, required)" in printed["data.prompts[].source"]


def test_defaults_are_the_recipes_defaults(capsys):
    """What the listing says a default is, is what a recipe without that key gets."""
    printed = listing(capsys)
    defaults = Recipe().to_dict()
    assert "default eyas-demo/prompts.jsonl" in printed["data.prompts"]
    assert f"default {defaults['train']['lr']}" in printed["train.lr"]
    assert f"default {defaults['capture']['shard_tokens']}" in printed["capture.shard_tokens"]


@pytest.mark.parametrize("section", list(Recipe.model_fields))
def test_section_filter(capsys, section):
    printed = listing(capsys, section)
    expected = {key for key, _, _ in every_key() if key.split(".")[0] == section}
    assert printed and set(printed) == expected


def test_unknown_section_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main_recipe_keys(["trian"])
    assert e.value.code == 2 and "invalid choice: 'trian'" in capsys.readouterr().err
