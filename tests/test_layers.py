"""Layers that point one way, and imports inside functions only where a heavy dependency needs them.

eyas's modules sit in layers, bottom to top (docs/architecture.md, "Layers"):

    infra    eyas/infra/: errors, atomic writes, a run's layout, checksums, the cache, running vLLM
    kinds    train/kinds/ minus each kind's core.py and recipe.py: the registry, `DraftKind`, each kind's
             torch-free spec, DraftConfig and the checkpoint format (config.json)
    recipes  recipes/ and each kind's recipe.py (its `draft` section): the schema, loading, defaults
    data     data/: targets, prompts, regeneration, capture, vocab
    train    train/ and each kind's core.py (its model and training unroll, loaded by name by the registry)
    serve    serve/: the loop, the server, export and import; each kind's loop.py (its round in the loop)
    eval     eval/: measuring drafts
    app      eyas/'s own modules (the CLI, the pipeline, the plan, publishing) and every `__main__`

A module imports only from its own layer or those below it: checked over every import statement, at the
top of a file or inside a function (an import under `if TYPE_CHECKING:`, for annotations only, is no edge).
So there is no loop among the folders data, train, eval, serve and eyas: the bottom of eyas/ (infra) and of
train/ (the kinds' specs) are layers of their own.

An import inside a function is there only to keep a heavy dependency off the importing module's import (the
CLI and the schema load without torch): a third-party module from HEAVY the module does not import at its
top, or an eyas module whose import brings such a dependency, which the line names in a comment
`# lazy: torch, transformers` (checked: exactly the heavy modules it adds).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_import_cycles import PACKAGE_DIRS, ROOT, _absolute, eyas_modules, type_checking

ORDER = ("infra", "kinds", "recipes", "data", "train", "serve", "eval", "app")
# slow to import, or optional: a torch submodule named here costs more than torch itself (dynamo, flex, FSDP)
HEAVY = frozenset(
    "torch transformers vllm accelerate deepspeed matplotlib datasets fastapi uvicorn huggingface_hub "
    "safetensors gguf hs_connectors tokenizers httpx httpx2 numpy torch._dynamo torch.distributed.fsdp "
    "torch.nn.attention.flex_attention".split()
)
LAZY = re.compile(r"#\s*lazy:\s*([\w, ]+)")


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[-1] == "__main__" or len(parts) == 1:
        return "app"
    if module.startswith("eyas.train.kinds"):  # a kind's home spans layers, each module named by the registry
        return {"recipe": "recipes", "core": "train", "loop": "serve"}.get(parts[-1], "kinds")
    second = parts[1]
    return {"infra": "infra", "recipes": "recipes", "data": "data", "train": "train", "serve": "serve"}.get(
        second, "eval" if second == "eval" else "app"
    )


def imports(path: Path, module: str, mods) -> list[tuple[ast.AST, list[str], bool]]:
    """Every import statement outside `if TYPE_CHECKING:` -> (node, the modules it names, inside a function).
    `from P import name` names P.name where that is an eyas module, else P."""
    tree = ast.parse(path.read_text(), str(path))
    out = []

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if type_checking(child):
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.append((child, [a.name for a in child.names], in_function))
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(child, module, path.name == "__init__.py")
                named = [f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in mods]
                out.append((child, named or [base], in_function))
            walk(child, inner)

    walk(tree, False)
    return out


def upward_imports(root: Path = ROOT, package_dirs: dict[str, str] = PACKAGE_DIRS) -> list[str]:
    mods = eyas_modules(root, package_dirs)
    bad = []
    for name, path in mods.items():
        mine = ORDER.index(layer_of(name))
        for node, targets, _ in imports(path, name, mods):
            for t in targets:
                if t in mods and ORDER.index(layer_of(t)) > mine:
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    bad.append(f"{where} ({layer_of(name)}) imports {t} ({layer_of(t)})")
    return bad


def _heavy(name: str) -> str | None:
    """The HEAVY module an import of `name` loads (its longest prefix there), None if light."""
    parts = name.split(".")
    return next((p for i in range(len(parts), 0, -1) if (p := ".".join(parts[:i])) in HEAVY), None)


def heavy_at_top(mods) -> dict[str, frozenset[str]]:
    """{module: the HEAVY modules importing it loads}: its module-level imports, followed through eyas's."""
    direct, deps = {}, {}
    for name, path in mods.items():
        found = [(t, n) for n, ts, inside in imports(path, name, mods) if not inside for t in ts]
        direct[name] = {h for t, _ in found if (h := _heavy(t))}
        parents = {".".join(t.split(".")[:i]) for t, _ in found for i in range(2, len(t.split(".")) + 1)}
        deps[name] = {m for m in parents if m in mods and m != name}
    memo: dict[str, frozenset[str]] = {}

    def close(m, seen=()):
        if m not in memo:
            acc = set(direct[m])
            for d in deps[m] - set(seen):
                acc |= close(d, (*seen, m))
            memo[m] = frozenset(acc)
        return memo[m]

    return {m: close(m) for m in mods}


def lazy_import_problems(root: Path = ROOT, package_dirs: dict[str, str] = PACKAGE_DIRS) -> list[str]:
    mods = eyas_modules(root, package_dirs)
    heavy = heavy_at_top(mods)
    bad = []
    for name, path in mods.items():
        lines = path.read_text().splitlines()
        for node, targets, inside in imports(path, name, mods):
            if not inside:
                continue
            where = f"{path.relative_to(root)}:{node.lineno}"
            said = next(filter(None, map(LAZY.search, lines[node.lineno - 1 : node.end_lineno])), None)
            named = {w.strip() for w in said.group(1).split(",") if w.strip()} if said else None
            for t in targets:
                adds = (heavy[t] if t in mods else {_heavy(t)} - {None}) - heavy[name]
                if not adds:
                    bad.append(
                        f"{where}: {t} inside a function adds no heavy dependency: import it at the top"
                    )
                elif t in mods and named != set(adds):
                    bad.append(f"{where}: {t} inside a function: say `# lazy: {', '.join(sorted(adds))}`")
    return bad


def test_the_checks_find_an_upward_import_and_a_needless_lazy_one(tmp_path):
    """A package laid out as eyas is: an upward edge inside a function and a lazy import of a light module
    are found; a lazy import of a torch-importing module naming torch, and a TYPE_CHECKING import, pass."""
    for folder in ("eyas", "eyas/infra", "data"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "eyas" / "infra" / "io.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from eyas.data.heavy import X\n"
        "def f():\n    from eyas.data.heavy import go  # lazy: torch\n"
    )
    (tmp_path / "data" / "heavy.py").write_text("import torch\ndef go():\n    from eyas.infra import io\n")
    (tmp_path / "data" / "light.py").write_text(
        "def go():\n    import json\n    from eyas.data import heavy\n"
    )
    dirs = {"eyas": "eyas", "data": "eyas.data"}
    assert upward_imports(tmp_path, dirs) == ["eyas/infra/io.py:5 (infra) imports eyas.data.heavy (data)"]
    assert lazy_import_problems(tmp_path, dirs) == [
        "data/heavy.py:3: eyas.infra.io inside a function adds no heavy dependency: import it at the top",
        "data/light.py:2: json inside a function adds no heavy dependency: import it at the top",
        "data/light.py:3: eyas.data.heavy inside a function: say `# lazy: torch`",
    ]
    assert [layer_of(m) for m in ("eyas.train.kinds.peagle", "eyas.train.kinds.peagle.core", "eyas.cli")] == [
        "kinds",
        "train",
        "app",
    ]


def test_layers_point_one_way():
    bad = upward_imports()
    assert not bad, "imports into a layer above (tests/test_layers.py ORDER):\n" + "\n".join(bad)


def test_no_loop_among_the_folders():
    """data, train, eval, serve and eyas (infra and the kinds' specs apart): no folder reaches itself."""
    mods = eyas_modules()
    node = {"infra": "eyas/infra", "kinds": "train/kinds", "app": "eyas"}
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        a = node.get(layer_of(name), layer_of(name))
        for _, targets, _ in imports(path, name, mods):
            b = [node.get(layer_of(t), layer_of(t)) for t in targets if t in mods]
            edges.setdefault(a, set()).update(x for x in b if x != a)
    reach = {a: set(bs) for a, bs in edges.items()}
    for _ in reach:
        for a in reach:
            reach[a] |= {c for b in list(reach[a]) for c in reach.get(b, ())}
    assert not [a for a in reach if a in reach[a]], reach


def test_imports_inside_functions_name_the_heavy_dependency():
    bad = lazy_import_problems()
    assert not bad, f"{len(bad)} imports inside functions:\n" + "\n".join(bad)
