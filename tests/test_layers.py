"""The package's layers (docs/ARCHITECTURE.md): imports only ever run downwards, and only the command layer
speaks in command-line flags."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvbench"

# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS: list[tuple[str, ...]] = [
    (
        "kvbench.errors",
        "kvbench.env_settings",
        "kvbench.fileio",
        "kvbench.json_input",
        "kvbench.private_cache",
        "kvbench.kv",
    ),
    (
        "kvbench.kernels",
        "kvbench.cpu",
        "kvbench.models",
        "kvbench.workload",
        "kvbench.scenarios",
        "kvbench.measure",
        "kvbench.preflight",
        "kvbench.values",
        "kvbench.units",
    ),
    ("kvbench.engine",),
    ("kvbench.results",),
    ("kvbench.report",),
    ("kvbench.endpoint",),
    ("kvbench.studies", "kvbench.serve"),
    ("kvbench.commands", "kvbench.cli"),
]
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]+")


def _module_files() -> list[tuple[str, Path]]:
    files = [(".".join(path.relative_to(ROOT).with_suffix("").parts), path) for path in PACKAGE.rglob("*.py")]
    return [(name.removesuffix(".__init__"), path) for name, path in files]


def _layer(module: str) -> int | None:
    for index, prefixes in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return index
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("kvbench")]


def test_every_module_has_a_layer():
    assert [name for name, _ in _module_files() if name != "kvbench" and _layer(name) is None] == []


@pytest.mark.parametrize("module, path", _module_files(), ids=lambda value: str(value))
def test_imports_run_downwards(module, path):
    own = _layer(module)
    if own is None:
        return
    upward = [
        f"{path.name}:{line} imports {name}"
        for line, name in _imports(path)
        if (target := _layer(name)) is not None and target > own
    ]
    assert upward == []


def _error_texts(path: Path) -> list[tuple[int, str]]:
    """The literal text of every ``raise KvbenchError(...)`` (f-string parts included)."""
    texts = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name.endswith("Error") or name == "RunFailed":
                parts = [
                    n.value
                    for arg in node.exc.args
                    for n in ast.walk(arg)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                ]
                texts.append((node.lineno, "".join(parts)))
    return texts


@pytest.mark.parametrize(
    "module, path",
    [(m, p) for m, p in _module_files() if _layer(m) is not None and _layer(m) < _layer("kvbench.commands")],
    ids=lambda value: str(value),
)
def test_only_commands_name_flags_in_errors(module, path):
    """Studies, reports and the engine say which setting is wrong; the command that owns a flag names it."""
    assert [f"{path.name}:{line}: {text}" for line, text in _error_texts(path) if _FLAG.search(text)] == []


# Where text below the command layer may name flags: the remedies a diagnosis renders are suggestions in the
# words of each engine (kvbench's, vLLM's, SGLang's options), by design.
SUGGESTIONS = {PACKAGE / "report" / "diagnose" / "remedies.py"}


def _message_texts(path: Path) -> list[tuple[int, str]]:
    """Every string literal that can reach a user (messages, titles, notes built anywhere, not only in
    ``raise``): all but docstrings and argument vectors (``["git", "rev-parse", "--short"]``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            skip.add(id(body[0].value))  # a docstring speaks to developers
        if isinstance(node, (ast.List, ast.Tuple)):
            skip.update(
                id(item)
                for item in node.elts
                if isinstance(item, ast.Constant)
                and isinstance(item.value, str)
                and re.fullmatch(r"--[a-z][a-z-]*", item.value)
            )  # an argument of a subprocess
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]


@pytest.mark.parametrize(
    "module, path",
    [
        (m, p)
        for m, p in _module_files()
        if _layer(m) is not None and _layer(m) < _layer("kvbench.commands") and p not in SUGGESTIONS
    ],
    ids=lambda value: str(value),
)
def test_only_commands_name_flags_in_any_message(module, path):
    """A message built below the command layer (a finding's remedy, a table title, a note) names no flag:
    the same code serves several commands, and only the command knows its flags."""
    assert [f"{path.name}:{line}: {text}" for line, text in _message_texts(path) if _FLAG.search(text)] == []


# -- no import circles ------------------------------------------------------------------------------------
# Circles still being removed, each listed with the modules it runs through. An entry goes when its circle does.
KNOWN_CIRCLES: list[frozenset[str]] = []


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module an import names: ``from kvbench.models import shapes`` names ``kvbench.models.shapes``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _graph(function_local: bool) -> dict[str, set[str]]:
    """Each module's kvbench imports: module-level ones (``if TYPE_CHECKING`` blocks included: they are arrows a
    reader and a type checker follow), and with ``function_local`` those inside functions too."""
    files = dict(_module_files())
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        names = _imported_names(ast.parse(path.read_text(encoding="utf-8")), function_local)
        graph[module] = {
            target for name in names if (target := _resolve(name, modules)) is not None and target != module
        }
    return graph


def _imported_names(tree: ast.AST, function_local: bool) -> list[str]:
    """The kvbench names a module's imports name (``from a import b`` names ``a.b``)."""
    found: list[str] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if function_local or not inside:
                if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                    found.extend(f"{child.module}.{alias.name}" for alias in child.names)
                elif isinstance(child, ast.Import):
                    found.extend(alias.name for alias in child.names)
            visit(child, inside)

    visit(tree, False)
    return [name for name in found if name.startswith("kvbench")]


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return found


def test_no_import_circles_at_module_level():
    """Module A imports B which imports A: neither can be read (or loaded) without the other."""
    assert [sorted(c) for c in _circles(_graph(function_local=False)) if c not in KNOWN_CIRCLES] == []


def test_no_import_circle_hidden_in_a_function():
    """A function-local import that closes a circle hides the arrow from readers; keep a local import only to
    load a heavy optional package (torch, Ray, vLLM, matplotlib) late, and say so in a comment."""
    assert [sorted(c) for c in _circles(_graph(function_local=True)) if c not in KNOWN_CIRCLES] == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
