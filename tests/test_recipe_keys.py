"""`eyas recipe-keys`: every key of every section, with its default and description, read from the schema."""

import pytest
from pydantic import BaseModel

from eyas.recipes.keys import default_text, main_recipe_keys
from eyas.recipes.schema import PromptSource, Recipe
from eyas.recipes.types import inner_model


def every_key() -> list[tuple[str, type[BaseModel], str]]:
    """(printed key, model, field) for every field of every section; PromptSource's as data.prompts[].KEY."""
    keys = []
    for section, info in Recipe.model_fields.items():
        model = inner_model(info.annotation)
        if model is None:
            keys.append((section, Recipe, section))
            continue
        keys += [(f"{section}.{name}", model, name) for name in model.model_fields]
    keys += [(f"data.prompts[].{name}", PromptSource, name) for name in PromptSource.model_fields]
    return keys


def listing(capsys, *argv: str) -> dict[str, str]:
    assert main_recipe_keys(list(argv)) == 0
    lines = capsys.readouterr().out.splitlines()
    return {line.split("  ", 1)[0]: line for line in lines}


def test_every_key_has_its_default_and_a_description(capsys):
    printed = listing(capsys)
    keys = every_key()
    assert len(keys) > 80 and set(printed) == {key for key, _, _ in keys}
    for key, model, name in keys:
        info = model.model_fields[name]
        assert info.description and info.description.strip(), f"{key} has no description"
        _, kind_and_default, description = printed[key].split("  ")
        assert kind_and_default.startswith("(") and kind_and_default.endswith(f", {default_text(info)})"), key
        assert description == info.description
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
