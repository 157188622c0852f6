"""The layout shows the architecture: no import circle, dependencies one way, small folders.

Read from the source with `ast`, every import counts: at module level, inside functions (lazy
imports), under `if TYPE_CHECKING:`. A circle between two files is a design error even when
Python happens to resolve it at run time.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo import REPO

PACKAGES = ("core", "http", "graphs")  # the `rillet` package's folders
MAX_PY_FILES = 15  # per folder, directly in it
SKIP_DIRS = {".git", ".venv", "build", "dist", ".gpu", "__pycache__", "out", ".mypy_cache", ".ruff_cache"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "rillet." + ".".join(parts)


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for top in PACKAGES for p in sorted((REPO / top).rglob("*.py"))}


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, list[str]]]:
    """(module, names) for every import statement in the file, relative ones resolved."""
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent) + (f".{base}" if base else "")
            yield base, [a.name for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (`from pkg import sub` counts as pkg.sub)."""
    modules = _project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text())
        for target, names in _imported(tree, name, path.name == "__init__.py"):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if subs:
                edges.update(subs)
            elif target in modules:
                edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_circle_through_a_lazy_import() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from rillet.x import y\n")
    assert list(_imported(tree, "rillet.z", False)) == [("rillet.x", ["y"])]


def test_no_import_circle_between_files() -> None:
    graph = import_graph()
    assert len(graph) > 100  # every file was read
    assert _cycles(graph) == []


def _imports_of(prefix: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in import_graph().items() if m == prefix or m.startswith(prefix + ".")}


@pytest.mark.parametrize(
    ("layer", "may_import"),
    [
        # dependencies flow one way: http -> core -> graphs; graphs sees no engine
        ("rillet.graphs", ("rillet.graphs",)),
        # inside http: wiring -> stream -> openai; guards, metrics, ui and launch stand alone
        ("rillet.http.openai", ("rillet.http.openai", "rillet.core")),
        # the other APIs' protocol layers: thin translators onto openai/'s chat path
        ("rillet.http.responses", ("rillet.http.responses", "rillet.http.openai", "rillet.core")),
        ("rillet.http.anthropic", ("rillet.http.anthropic", "rillet.http.openai", "rillet.core")),
        (
            "rillet.http.stream",
            ("rillet.http.stream", "rillet.http.openai", "rillet.http.metrics", "rillet.core"),
        ),
        ("rillet.http.net", ("rillet.http.net", "rillet.http.openai", "rillet.core")),
        ("rillet.http.metrics", ("rillet.http.metrics",)),
        ("rillet.http.ui", ("rillet.http.ui",)),
        ("rillet.http.launch", ("rillet.http.launch", "rillet.core")),
        # image loading (fetch, SSRF guard, files) over openai/'s parsing of the parts
        ("rillet.http.vision", ("rillet.http.vision", "rillet.http.openai", "rillet.core")),
    ],
)
def test_layers_import_only_what_is_below_them(layer: str, may_import: tuple[str, ...]) -> None:
    wrong = {
        (m, d)
        for m, deps in _imports_of(layer).items()
        for d in deps
        if not any(d == ok or d.startswith(ok + ".") for ok in may_import)
    }
    assert not wrong, sorted(wrong)


def _third_party(paths: list[Path], names: tuple[str, ...]) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.relative_to(REPO)}: {m}" for m in mods if m.split(".")[0] in names]
    return found


@pytest.mark.parametrize("layer", ["openai", "responses", "anthropic"])
def test_the_protocol_layers_import_no_web_framework_and_no_torch(layer: str) -> None:
    assert _third_party(sorted((REPO / "http" / layer).rglob("*.py")), ("aiohttp", "torch")) == []


def _folders() -> Iterator[Path]:
    def walk(folder: Path) -> Iterator[Path]:
        yield folder
        for child in sorted(folder.iterdir()):
            if child.is_dir() and child.name not in SKIP_DIRS and not child.name.startswith("."):
                yield from walk(child)

    for top in (*PACKAGES, "tests", "bench"):
        yield from walk(REPO / top)


def test_no_folder_holds_more_than_15_python_files() -> None:
    crowded = {
        str(f.relative_to(REPO)): n for f in _folders() if (n := len(list(f.glob("*.py")))) > MAX_PY_FILES
    }
    assert crowded == {}
