"""The package's module structure: no import cycles among fastattn's modules,
no module using another module's private (``_``) names, and one version.

Read from the source with ``ast`` (nothing is imported): an edge ``a -> b``
is an import of fastattn module ``b`` that runs when ``a`` is imported, i.e.
at module level (``if TYPE_CHECKING:`` blocks and imports inside functions
excluded); importing ``fastattn.x`` also runs ``fastattn/__init__.py``, an
edge left out here because Python handles it (the package is initialised
first), unless a module imports a name from the package itself."""

from __future__ import annotations

import ast
import pathlib
import re

import fastattn

# the source tree of this checkout (not the imported package's folder: a
# build tree, as .ci/sanitize.sh imports, has the extensions but not their
# .pyx sources, nor pyproject.toml)
REPO = pathlib.Path(__file__).resolve().parents[2]
ROOT = REPO / "fastattn"


def _module_name(path: pathlib.Path) -> str:
    parts = ("fastattn",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
PACKAGES = {_module_name(p) for p in ROOT.rglob("__init__.py")}
# the compiled extensions are modules too, and so is the build's record of its
# flags, which setup.py writes at build time
EXTENSIONS = {_module_name(p) for p in ROOT.rglob("*.pyx")} | {"fastattn._build_config"}


def _is_module(name: str) -> bool:
    return name in MODULES or name in EXTENSIONS


def _base(module: str, node: ast.ImportFrom) -> str:
    """The absolute module named by ``from <node.module> import ...`` in ``module``."""
    if node.level == 0:
        return node.module or ""
    package = module if module in PACKAGES else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _top_level_imports(tree: ast.Module):
    """The import statements that run at import time (not in functions or
    classes' methods, not under ``if TYPE_CHECKING:``)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            todo[:0] = node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo[:0] = node.body + node.orelse + node.finalbody + [
                s for h in node.handlers for s in h.body]


def _targets(module: str, node) -> list[tuple[str, str | None]]:
    """(fastattn module imported, the name taken from it or None) pairs."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name.split(".")[0] == "fastattn"]
    base = _base(module, node)
    if base.split(".")[0] != "fastattn":
        return []
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append((sub, None) if _is_module(sub) else (base, a.name))
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _top_level_imports(tree):
            for target, name in _targets(module, node):
                if target in MODULES and target != module and (
                        target not in PACKAGES or name is not None
                        or not module.startswith(target + ".")):
                    graph[module].add(target)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_module_level_imports_among_fastattn_modules_have_no_cycle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_two_module_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(module: str, tree: ast.Module) -> list[str]:
    """``from fastattn.x import _name`` anywhere in the module, and
    ``x._name`` on a fastattn module bound by an import (submodules aside)."""
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target, name in _targets(module, node):
                if name is not None and _private(name):
                    found.append(f"line {node.lineno}: {name} from {target}")
            if isinstance(node, ast.ImportFrom):
                base = _base(module, node)
                for a in node.names:
                    if _is_module(f"{base}.{a.name}"):
                        bound[a.asname or a.name] = f"{base}.{a.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound and _private(node.attr)
                and not _is_module(f"{bound[node.value.id]}.{node.attr}")):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_a_private_name_of_another_fastattn_module():
    # The benchmark (fastattn/bench/) is a tool beside the layers, calling only
    # the public API; the private names its own modules share are its business.
    bad = {}
    for module, path in MODULES.items():
        if module.startswith("fastattn.bench"):
            continue
        uses = _private_uses(module, ast.parse(path.read_text(encoding="utf-8")))
        if uses:
            bad[module] = uses
    assert not bad, bad


def test_private_name_finder_sees_both_forms():
    tree = ast.parse("from . import _api\nfrom ._api import _dtypes\nx = _api._threads\n")
    assert len(_private_uses("fastattn.mha", tree)) == 2


def test_version_is_the_one_of_pyproject():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    (version,) = re.findall(r'^version\s*=\s*"([^"]+)"', project, flags=re.M)
    assert fastattn.__version__ == version
