"""A draft kind lives in its home (train/kinds/<name>/, the registry train/kinds/__init__.py): no other module
compares a kind's name or keys a table by kind names. The trainer, the loop, export, import, the plan and the
schema ask a kind through its interface (train/kinds/base.py DraftKind) instead.

Read from the AST: a comparison (==, !=, in, not in) or a `match` of something named `kind` (a variable, an
attribute `.kind` or `.draft_kind`, `kind.name`, a `["kind"]` item, `.get("kind")`) with a kind's name, and a
dict literal keyed by two or more kind names only. Layout names ("eagle3", "dflash": serve/interchange/
formats.py FORMATS) and vLLM's method names are not kinds and compare with other names, so they are not
counted. benchmarks/ is not read: a benchmark picks the kinds it runs, by name, from its command line.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from eyas.train.kinds import KINDS
from tests.test_import_cycles import ROOT, eyas_modules

HOMES = ("train/kinds/",)


def _is_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("kind", "draft_kind")
    if isinstance(node, ast.Attribute):
        return node.attr in ("kind", "draft_kind") or (node.attr == "name" and _names_a_kind(node.value))
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value in ("kind", "draft_kind")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        first = node.args[0] if node.args else None
        return isinstance(first, ast.Constant) and first.value in ("kind", "draft_kind")
    return False


def _names_a_kind(node: ast.AST) -> bool:
    """`kind`, `cfg.kind`, ... or a registry lookup (`kind_of(cfg)`, `kind_named(n)`, `published_kind(r)`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in ("kind_of", "kind_named", "published_kind")
    return _is_kind(node)


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
        elif isinstance(node, ast.Match) and _is_kind(node.subject):
            cases = [c.pattern for c in node.cases if isinstance(c.pattern, ast.MatchValue)]
            if any(_names(c.value) for c in cases):
                found.append((node.lineno, "matches a kind against kind names"))
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant) and k.value in KINDS]
            if len(keys) >= 2 and len(keys) == len(node.keys):  # a layout table names "speculators" too
                found.append((node.lineno, f"a table keyed by kinds {[k.value for k in keys]}"))
    return sorted(found)


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
        'if kind_of(cfg).name == "dflash": pass\n'
        'y = r.get("draft_kind") != "eagle3"\n'
        'match cfg.kind:\n    case "peagle": pass\n'
    )
    assert [line for line, _ in kind_name_uses(ast.parse(code))] == [1, 2, 3, 6, 7, 8, 9]


def test_the_kinds_and_the_schema_import_no_torch():
    """The schema and `eyas plan` read a kind before anything loads: the registry, each kind's `__init__.py`
    and the schema stay torch-free (a kind's torch half is its core.py, imported on first use)."""
    code = (
        "import sys, eyas.recipes.schema, eyas.train.kinds as k\n"
        "[k.kind_named(n).unrolled(eyas.recipes.schema.TrainSection()) for n in k.KINDS]\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_published_config_is_read_as_its_kind():
    """published_kind on the config.json every layout writes for every kind (what `eyas eval --server`,
    bench_baselines.py and vLLM's launcher turn into vLLM's speculative config): speculators' DFlash layout
    writes a top-level mask_token_id as P-EAGLE's does, and stays DFlash's."""
    import torch

    from eyas.train.kinds import KINDS, published_kind, speculative_config
    from eyas.train.kinds.config import DraftConfig

    sizes = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    base = {
        **sizes,
        "intermediate_size": 48,
        "vocab_size": 97,
        "draft_vocab_size": 40,
        "aux_layer_ids": [1, 2],
    }
    cfgs = {
        "eagle3": DraftConfig(**base),
        "peagle": DraftConfig(**base, kind="peagle", mask_token_id=96),
        "dflash": DraftConfig(**base, kind="dflash", mask_token_id=96, block_size=4, num_layers=2),
    }
    assert set(cfgs) == set(KINDS)
    assert all(
        k.formats[-1] == "speculators" for k in KINDS.values()
    )  # each: a layout of its own, speculators'

    def writer(fmt_of):  # a kind's config.json writer (DraftKind.published_config) for one of its layouts
        return {n: lambda c, n=n, **kw: KINDS[n].published_config(c, fmt_of(KINDS[n]), **kw) for n in cfgs}

    own, spec = writer(lambda k: k.formats[0]), writer(lambda k: k.formats[-1])
    methods = {"eagle3": ("eagle3", None), "peagle": ("eagle3", True), "dflash": ("dflash", None)}
    for name, cfg in cfgs.items():
        for layout in (own, spec):
            raw = layout[name](cfg, dtype=torch.bfloat16, k=3, verifier=("t", ["A"]))
            assert published_kind(raw).name == name, (name, raw)
    for name, (method, parallel) in methods.items():
        cfg = cfgs[name]
        with tempfile.TemporaryDirectory() as d:
            for layout in (own, spec):
                raw = layout[name](cfg, dtype=torch.bfloat16, k=3, verifier=("t", ["A"]))
                (Path(d) / "config.json").write_text(json.dumps(raw))
                got = speculative_config(d, 3)
                assert (got["method"], got.get("parallel_drafting")) == (method, parallel), (name, got)


def test_each_kinds_unroll_has_the_shared_signature():
    """train/grids.py Unroll: each kind's UNROLL takes the seven inputs by position, every shared setting by
    name with the same default, and then exactly the options its kind passes it (DraftKind.options)."""
    import inspect as _inspect

    for name, kind in KINDS.items():  # and each kind's teacher rows (ROWS): the inputs, then the steps
        head = list(_inspect.signature(kind.rows).parameters)[:4]
        assert head == ["input_ids", "loss_mask", "doc_ids", head[3]], (name, head)
    import inspect

    from eyas.recipes.schema import TrainSection
    from eyas.train.grids import Unroll

    shared = list(inspect.signature(Unroll.__call__).parameters.values())[1:]
    inputs = [p for p in shared if p.kind is p.POSITIONAL_ONLY]
    settings = [p for p in shared if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert len(inputs) == 7 and [p.name for p in settings][:2] == ["decay", "attention"]
    for name, kind in KINDS.items():
        params = list(inspect.signature(kind.forward).parameters.values())
        assert all(p.default is p.empty for p in params[:7]), name
        got = [(p.name, p.default) for p in params[7 : 7 + len(settings)]]
        assert got == [(p.name, p.default) for p in settings], name
        assert [p.name for p in params[7 + len(settings) :]] == list(kind.options(TrainSection())), name


def test_each_kind_has_its_own_checkpoint_config():
    """DraftConfig(kind=K) is K's own class (train/kinds/<K>/config.py): a field another kind owns is not
    there (an EAGLE-3 draft has no block, a DFlash draft no EAGLE-3 layer option), and given, it is refused; a
    record written before (every kind's fields, the others at null or false) reads back through from_dict,
    which refuses another kind's field that is set and a field no kind has; a DFlash training checkpoint's
    config.json is z-lab's layout, not EAGLE-3's."""
    import dataclasses

    import torch

    from eyas.train.kinds import KINDS
    from eyas.train.kinds.config import DraftConfig

    base = dict(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48
    )
    base.update(vocab_size=97, draft_vocab_size=40, aux_layer_ids=[1, 2])
    own = {"eagle3": {}, "peagle": {"mask_token_id": 96}, "dflash": {"mask_token_id": 96, "block_size": 4}}
    assert set(own) == set(KINDS)
    flat = {
        "norm_before_fc": False,
        "norm_before_residual": False,
        "norm_output": False,
        "sliding_window": None,
    }
    flat.update(mask_token_id=None, block_size=None, attention_bias=False)
    for name, kind in KINDS.items():
        cfg = DraftConfig(**base, kind=name, **own[name])
        assert type(cfg) is kind.config_class and cfg.kind == name
        assert dataclasses.replace(cfg, num_layers=2).kind == name
        assert DraftConfig.from_dict({**flat, **cfg.to_dict()}) == cfg  # an old record's unset fields dropped
    assert not hasattr(DraftConfig(**base), "block_size")
    assert not hasattr(DraftConfig(**base, kind="dflash", **own["dflash"]), "norm_before_fc")
    with pytest.raises(TypeError, match="block_size"):
        DraftConfig(**base, block_size=4)
    with pytest.raises(
        ValueError, match=r"^draft config of kind 'dflash': norm_output not fields of that kind"
    ):
        DraftConfig.from_dict({**base, **own["dflash"], "kind": "dflash", "norm_output": True})
    with pytest.raises(ValueError, match=r"^draft config of kind 'eagle3': bogus not fields of that kind"):
        DraftConfig.from_dict({**base, "bogus": None})
    with pytest.raises(ValueError, match=r"^unknown draft kind 'dspark'"):
        DraftConfig(**base, kind="dspark")
    dflash = DraftConfig(**base, kind="dflash", **own["dflash"])
    raw = KINDS["dflash"].checkpoint_config(dflash, torch.bfloat16)
    z_lab = KINDS["dflash"].published_config(dflash, "dflash", torch.bfloat16, 3, None)
    assert raw["architectures"] == z_lab["architectures"]
    assert "norm_before_fc" not in raw and raw["block_size"] == 4
