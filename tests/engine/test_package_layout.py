"""The package's shape: the scheduling core imports no torch, no module-level import cycle, and
no module in the engine, attention or native packages grows past 600 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from package_graph import all_modules, find_cycle, import_targets, is_type_checking

MAX_LINES = 600


def load_time_imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports while it loads: module-level statements, outside
    ``if TYPE_CHECKING:`` blocks (imports inside functions run later, not at load)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and is_type_checking(node):
                visit(node.orelse)
                continue
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, block, []):
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)

    visit(tree.body)
    return {m for m in found if m in modules and m != name}


def test_no_module_level_import_cycle():
    modules = all_modules()
    graph = {name: load_time_imports(path, name, modules) for name, path in modules.items()}
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_engine_core_imports_no_torch():
    core = sorted(n for n in all_modules() if n.startswith("langchain_ascend.engine.core"))
    code = ("import importlib, sys\n"
            f"for name in {core!r}:\n"
            "    importlib.import_module(name)\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
            "import langchain_ascend.engine as engine\n"
            "assert engine.SamplingParams and engine.TokenDelta and 'torch' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(core) >= 7


def test_engine_modules_stay_small():
    sizes = {name: len(path.read_text().splitlines()) for name, path in all_modules().items()
             if name.split(".")[1:2] in (["engine"], ["attention"], ["native"])}
    assert sizes
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def _engine_part(module: str) -> str | None:
    """``langchain_ascend.engine.<part>`` of an engine module (its subpackage or module)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) >= 3 and parts[1] == "engine" else None


def test_engine_parts_import_no_circle_counting_type_only_imports():
    """Issue 34: ``engine/cpu`` and ``engine/worker`` (and every other part of the engine) do
    not import each other in a circle, counting every import statement -- inside functions
    and ``if TYPE_CHECKING:`` blocks too."""
    graph: dict[str, set[str]] = {}
    for name in all_modules():
        part = _engine_part(name)
        if part is None:
            continue
        for node in ast.walk(ast.parse(all_modules()[name].read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in import_targets(name, node):
                    other = _engine_part(target)
                    if other is not None and other != part:
                        graph.setdefault(part, set()).add(other)
    assert "langchain_ascend.engine.cpu" in graph  # the graph is read, not empty
    assert find_cycle(graph) is None, find_cycle(graph)
