"""A draft kind lives in its home (train/kinds/<name>/, the registry train/kinds/__init__.py): no other module
compares a kind's name or keys a table by kind names. The trainer, the loop, export, import, the plan and the
schema ask a kind through its interface (train/kinds/base.py DraftKind) instead.

Read from the AST: a comparison (==, !=, in, not in) of something named `kind` (a variable, an attribute
`.kind`, a `["kind"]` item) with a kind's name, and a dict literal keyed by two or more kind names only.
Layout names ("eagle3", "dflash": serve/interchange/formats.py FORMATS) and vLLM's method names are not
kinds and compare with other names, so they are not counted.
"""

from __future__ import annotations

import ast

from eyas.train.kinds import KINDS
from tests.test_import_cycles import ROOT, eyas_modules

HOMES = ("train/kinds/",)


def _is_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("kind", "draft_kind")
    if isinstance(node, ast.Attribute):
        return node.attr in ("kind", "draft_kind")
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value in ("kind", "draft_kind")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind"
    return False


def _names(node: ast.AST) -> set[str]:
    """Kind names a constant (or a tuple / list / set of constants) holds."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and i.value in KINDS}


def kind_name_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every comparison of a kind with a kind's name, and every table keyed by kind names."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(s) for s in sides) and any(_names(s) for s in sides):
                names = sorted(set().union(*map(_names, sides)))
                found.append((node.lineno, f"compares a kind with {names}"))
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant) and k.value in KINDS]
            if len(keys) >= 2 and len(keys) == len(node.keys):  # a layout table names "speculators" too
                found.append((node.lineno, f"a table keyed by kinds {[k.value for k in keys]}"))
    return found


def test_no_kind_name_outside_the_kinds_homes():
    outside = []
    for name, path in eyas_modules().items():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(HOMES):
            continue
        outside += [f"{rel}:{line}: {what}" for line, what in kind_name_uses(ast.parse(path.read_text()))]
    assert outside == [], "\n".join(outside)


def test_the_check_finds_what_it_looks_for():
    """A comparison and a table of the kinds the test refuses, and a layout name it lets pass."""
    code = (
        'if cfg.kind == "dflash": pass\n'
        'if kind in ("peagle", "dflash"): pass\n'
        'T = {"eagle3": 1, "peagle": 2}\n'
        'F = {"eagle3": 1, "speculators": 2, "dflash": 3}\n'
        'if fmt == "eagle3": pass\n'
        'x = run.get("kind", "eagle3") == "peagle"\n'
    )
    assert [line for line, _ in kind_name_uses(ast.parse(code))] == [1, 2, 3, 6]
