"""No import cycle among eyas's modules, lazy (function-level) imports included (an import under
`if TYPE_CHECKING:`, for annotations only, runs never and is no edge).

Each stage folder at the top of the repo is a subpackage of `eyas` (pyproject.toml's package-dir):
`data/x.py` is `eyas.data.x`. Every `import` / `from ... import` anywhere in a file's AST is an edge,
`from P import name` to `P.name` when that is a module and to `P` otherwise; importing a module also
imports its parent packages. A cycle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {
    "eyas": "eyas",
    "data": "eyas.data",
    "train": "eyas.train",
    "eval": "eyas.eval",
    "serve": "eyas.serve",
    "recipes": "eyas.recipes",
}


def eyas_modules(root: Path = ROOT, package_dirs: dict[str, str] = PACKAGE_DIRS) -> dict[str, Path]:
    """{dotted module name: file} for every module of the eyas distribution."""
    mods = {}
    for folder, package in package_dirs.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([package, *parts])] = path
    return mods


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _with_parents(name: str, mods: dict[str, Path]) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(mods)


def type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (annotations only: no import at run time)."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def runtime_nodes(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(tree):
        if not type_checking(child):
            yield child
            yield from runtime_nodes(child)


def import_graph(root: Path = ROOT, package_dirs: dict[str, str] = PACKAGE_DIRS) -> dict[str, set[str]]:
    """{module: modules of eyas it imports anywhere in its file}."""
    mods = eyas_modules(root, package_dirs)
    graph = {}
    for name, path in mods.items():
        edges: set[str] = set()
        for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edges |= _with_parents(alias.name, mods)
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(node, name, path.name == "__init__.py")
                edges |= _with_parents(target, mods)
                for alias in node.names:
                    edges |= _with_parents(f"{target}.{alias.name}", mods)
        # a package's own __init__ runs before its modules: not an edge back into the package
        graph[name] = {e for e in edges if e != name and not name.startswith(e + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_lazy_relative_and_remapped_imports(tmp_path):
    """A package laid out as eyas is (a folder remapped to a subpackage), whose cycle closes only through
    a lazy import inside a function and a relative import: both edges are seen, and the cycle is found."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "stage").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "stage" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "table.py").write_text(
        "def run():\n    from pkg.stage.work import go\n    return go\n"
    )
    (tmp_path / "stage" / "work.py").write_text("from . import helper\n\ndef go():\n    pass\n")
    (tmp_path / "stage" / "helper.py").write_text("import pkg.table as t\n")
    graph = import_graph(tmp_path, {"pkg": "pkg", "stage": "pkg.stage"})
    assert graph["pkg.table"] == {"pkg.stage", "pkg.stage.work"}
    assert graph["pkg.stage.work"] == {"pkg.stage.helper"}
    assert cycles(graph) == [["pkg.stage.helper", "pkg.stage.work", "pkg.table"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert eyas_modules()["eyas.data.chat"] == ROOT / "data" / "chat.py"


def test_no_import_cycle_among_eyas_modules():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
