"""Reading a recipe: a YAML file, a shipped recipe's name or a dict, with dotted overrides, into the models of
recipes/schema.py; pydantic's errors worded as one line naming the dotted key, as eyas has always worded
them; and the checks that need the target's config.json (its layer count and vocabulary).
"""

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from eyas.infra.layout import RECIPE
from eyas.recipes.draft import SECTIONS
from eyas.recipes.schema import Recipe, RecipeError, check
from eyas.recipes.types import inner_model, tagged_member
from eyas.train.kinds import DEFAULT_KIND

# ------------------------------------------------------------------ pydantic's errors, in our words

_SAYS = {
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "list_type": "expected a list",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "literal_error": "expected a string",
    "missing": "required (no default)",
    # range errors that say more than the bounds do
    "data.max_turns": "must be >= 1 (1: only the first user turn) or null (all), got {v}",
    "data.prompts.weight": "must be > 0, got {v}",
    "capture.teacher_topk": "must be >= 1, got {v}",
    "draft.num_layers": "must be >= 1, got {v}",
    "eval.k": "must be >= 1, got {v}",
    "train.val_every": "must be >= 0 (0: validate only at the end)",
    "eval.top_k": "must be -1 or 0 (off) or >= 1",
}


def _owner(loc: tuple) -> type[BaseModel]:
    """The model holding the last key of an error's location (list indices skipped; a union's tag picks its
    member: the draft section of `draft.kind`)."""
    cls, annotation = Recipe, None
    for part in loc[:-1]:
        if isinstance(part, str) and part.startswith("|") and annotation is not None:
            cls = tagged_member(annotation, part) or cls
        elif part in cls.model_fields:
            annotation = cls.model_fields[part].annotation
            cls = inner_model(annotation)
    return cls


def _range(e: dict, key: str) -> str:
    """`must be >= 1`, `must be in (0, 1]`: the field's bounds, unless _SAYS has more to say for its key."""
    b = {
        k: getattr(c, k)
        for c in _owner(e["loc"]).model_fields[e["loc"][-1]].metadata
        for k in ("gt", "ge", "lt", "le")
        if hasattr(c, k)
    }
    lo, hi = "gt" if "gt" in b else "ge", "lt" if "lt" in b else "le"
    says = (
        f"must be {'>' if lo == 'gt' else '>='} {b[lo]:g}"
        if hi not in b
        else f"must be in {'(' if lo == 'gt' else '['}{b[lo]:g}, {b[hi]:g}{']' if hi == 'le' else ')'}"
    )
    v = e["input"]
    v = float(v) if any(isinstance(x, float) for x in e["ctx"].values()) else v  # a float field's 0 is 0.0
    return _SAYS.get(re.sub(r"\[\d+\]", "", key), says).format(v=v)


def _message(e: dict) -> tuple[int, str]:
    """(phase, line) for one pydantic error; phase 0 (structure and types) is reported before 1 (values)."""
    kind, loc, v, ctx = e["type"], e["loc"], e["input"], e.get("ctx", {})
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc if not str(p).startswith("|"))
    key = key[1:] or "recipe"
    if kind == "value_error" and isinstance(ctx["error"], RecipeError):  # a model_validator's, key and all
        return 1, str(ctx["error"])
    if kind == "literal_error" and isinstance(v, str):
        return 1, f"{key}: must be {ctx['expected'].replace(chr(39), '')}, got {v!r}"
    if kind == "extra_forbidden":
        owner = _owner(loc)
        mine = owner.model_fields["kind"].default if "kind" in owner.model_fields else None
        others = [n for n, c in SECTIONS.items() if mine and loc[-1] in c.model_fields]
        if others:  # another kind's key, set (draft.kind switched by an override, say)
            shown = str(v).lower() if isinstance(v, bool) else v
            return 0, (
                f"{key}: {shown} is a key of draft.kind {' or '.join(others)}, not {mine}: remove it "
                "(another kind's key at false or null is dropped)"
            )
        of = f" for draft.kind {mine}" if mine else ""
        return 0, f"{key}: unknown key{of} (known: {', '.join(sorted(owner.model_fields))})"
    if kind == "draft_kind":  # recipes/draft.py: no kind of that name
        return 1, f"{e['msg']}, got {v.get('kind')!r}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return 1, f"{key}: {_range(e, key)}"
    item = kind == "model_type" and loc and isinstance(loc[-1], int)  # a list item: say what it holds
    what = f" ({', '.join(_owner(loc + ('',)).model_fields)})" if item else ""
    return 0, f"{key}: {_SAYS.get(kind, e['msg'])}{what}" + ("" if kind == "missing" else f", got {v!r}")


def _recipe_error(err: ValidationError) -> RecipeError:
    """The error the hand-written checker reported first: a type before a value, and an unknown key before
    anything inside the mapping that holds it."""
    found = [(*_message(e), e["loc"]) for e in err.errors()]
    first = min(found, key=lambda f: f[0])
    outer = [f for f in found if "unknown key" in f[1] and f[2][:-1] == first[2][: len(f[2]) - 1]]
    return RecipeError(min(outer, key=lambda f: len(f[2]), default=first)[1])


# ------------------------------------------------------------------ reading


class Replace(dict):
    """A mapping given whole on the command line (`eval.benchmarks={gsm8k: t.jsonl}`): it replaces the
    recipe's mapping, where dotted keys (`eval.benchmarks.gsm8k=t.jsonl`) merge into it one by one."""


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`train.lr=3e-4 eval.k=5` -> nested dict; values are parsed as YAML scalars/lists/mappings (a mapping
    value is a `Replace`)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        check("=" in pair, f"override {pair!r}", "expected key.sub=value")
        key, value = pair.split("=", 1)
        node, parts = out, key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            check(isinstance(node, dict), f"override {key}", f"{p} is not a section")
        parsed = yaml.safe_load(value) if value != "" else None
        node[parts[-1]] = Replace(parsed) if isinstance(parsed, dict) else parsed
    return out


def _merge(base: dict, over: dict) -> dict:
    """`over` into `base`, section by section; a `Replace` mapping replaces the value whole."""
    merged = dict(base)
    for k, v in over.items():
        deeper = isinstance(v, dict) and not isinstance(v, Replace) and isinstance(merged.get(k), dict)
        merged[k] = _merge(merged[k], v) if deeper else v
    return merged


def builtin_recipe_path(name: str) -> Path | None:
    """`demo` or `demo.yaml` -> the recipe shipped inside eyas.recipes."""
    p = Path(__file__).parent / (name if name.endswith(".yaml") else f"{name}.yaml")
    return p if p.is_file() else None


def load_recipe(source: str | Path | dict | None, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe file (or a shipped recipe name, or a dict), apply dotted overrides, validate."""
    raw = source or {}
    if source is not None and not isinstance(source, dict):
        path = Path(source) if Path(source).is_file() else builtin_recipe_path(str(source))
        check(path, f"recipe {source}", "no such file")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise RecipeError(f"recipe {path}: not valid YAML: {e}") from e
    over = parse_overrides(overrides or [])
    kind_switch(raw, over, source)
    try:
        return Recipe.model_validate(_merge(raw, over))
    except ValidationError as e:
        raise _recipe_error(e) from None


def kind_switch(raw: dict, over: dict, source: Any) -> None:
    """Refuse an override of `draft.kind` over a file whose draft section holds, at the file's kind's default,
    a key whose default the new kind sets otherwise: a run's saved recipe.yaml writes every key, so
    `draft.kind=dflash` over an EAGLE-3 run's would train a 1-layer DFlash (EAGLE-3's num_layers) where
    DFlash's own default is 5. The command line (or a recipe of the new kind) says which is meant."""
    if isinstance(over.get("draft"), Replace):  # `draft={...}`: the file's section is not read
        return
    file_draft = raw.get("draft") if isinstance(raw.get("draft"), dict) else {}
    over_draft = over.get("draft") if isinstance(over.get("draft"), dict) else {}
    old, new = file_draft.get("kind", DEFAULT_KIND), over_draft.get("kind")
    if new is None or new == old or old not in SECTIONS or new not in SECTIONS:
        return
    was, now = SECTIONS[old].model_fields, SECTIONS[new].model_fields
    held = [
        f"draft.{k}: {v!r} ({old}'s default; {new}'s is {now[k].default!r})"
        for k, v in file_draft.items()
        if k in was and k in now and k not in over_draft and v == was[k].default != now[k].default
    ]
    check(
        not held,
        f"draft.kind={new} over recipe {source} (kind {old})",
        f"it holds {', '.join(held)}: give each on the command line (draft.KEY=VALUE), or start from a "
        f"recipe of kind {new}",
    )


def dump_recipe(r: Recipe) -> str:
    return yaml.safe_dump(r.to_dict(), sort_keys=False)


# ------------------------------------------------------------------ against the target


def _diff(a: dict, b: dict, prefix: str = "", defaults: dict | None = None) -> list[str]:
    """Keys whose values differ between a saved recipe section `a` and `b`. A key the saved recipe lacks
    (added to the schema after the run was made) counts as its default; one `b` lacks at null or false
    (another draft kind's, in a recipe saved before each kind had its own section) as unset."""
    keys, defaults = [], defaults or {}
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k, defaults.get(k)), b.get(k)
        if k not in b and va in (None, False):
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += _diff(
                va, vb, f"{prefix}{k}.", defaults.get(k) if isinstance(defaults.get(k), dict) else None
            )
        elif va != vb:
            keys.append(f"{prefix}{k}")
    return keys


def changed_keys(saved: dict, new: dict, sections: tuple[str, ...]) -> list[str]:
    """The dotted keys of `sections` whose values differ between a saved recipe dict and `new` (both as
    Recipe.to_dict gives them); a key the saved one lacks (added to the schema since) counts as its
    default."""
    defaults = Recipe().to_dict()
    return [k for sec in sections for k in _diff(saved.get(sec, {}), new[sec], f"{sec}.", defaults.get(sec))]


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux layers: inputs of layers [2, N//2, N-3]; for tiny targets three distinct
    ids where possible (vLLM and SGLang build fc for exactly 3), never 0 (engines count from layer 0's
    output)."""
    if num_layers >= 6:
        return [2, num_layers // 2, num_layers - 3]
    return sorted({min(i, num_layers - 1) for i in (1, max(num_layers // 2, 1), num_layers - 1)})


def check_against_target(r: Recipe, num_layers: int, vocab_size: int) -> list[int]:
    """Checks that need the target config; returns the resolved aux layer ids (vLLM convention: id k is the
    input of decoder layer k, id N the last layer's output before the final norm)."""
    ids = r.capture.aux_layer_ids
    ids = default_aux_layer_ids(num_layers) if ids is None else ids
    convention = (
        f"vLLM convention: id k is the input of decoder layer k, id {num_layers} the output of the last "
        f"layer before the final norm: ids run 0..{num_layers}"
    )
    for i in ids:
        check(
            i <= num_layers,
            "capture.aux_layer_ids",
            f"layer id {i} > the target's {num_layers} layers ({convention})",
        )
    v = r.vocab.draft_vocab_size
    check(v <= vocab_size, "vocab.draft_vocab_size", f"{v} > the target's vocab size {vocab_size}")
    return list(ids)


def recipe_and_run(source: str, out: str | None, overrides: list[str]) -> tuple[Recipe, Path]:
    """`source` is a recipe file/name, or a run dir holding recipe.yaml (then it is the run dir too)."""
    src = Path(source)
    if src.is_dir() and (src / RECIPE).is_file():
        return load_recipe(src / RECIPE, overrides), Path(out) if out else src
    recipe = load_recipe(source, overrides)
    return recipe, Path(out) if out else Path("runs") / recipe.name
