"""Reading the package's modules for the shape tests (imported by name: tests/ has no
packages): module names, the module list, ``if TYPE_CHECKING:`` blocks, what an import statement
imports, import cycles."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import langchain_ascend

PACKAGE_ROOT = Path(langchain_ascend.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_ROOT.rglob("*.py"))}


def is_type_checking(node: ast.AST) -> bool:
    """``node`` is an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) block."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def import_targets(name: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Package modules the statement ``node`` of module ``name`` imports.

    ``from pkg import x`` counts as an import of ``pkg.x`` when that is a module, else of
    ``pkg``; relative imports are resolved against ``name``'s package.
    """
    modules = all_modules()
    if isinstance(node, ast.Import):
        found = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:
            package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        found = set()
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> imported modules) as a closed path, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None
