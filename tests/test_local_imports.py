"""Imports of the package's own modules sit at the top of each module (issue 26), where readers
and tools see the graph. One stays inside a function only when loading it there would pull a
heavy or optional dependency (torch, transformers, xgrammar, Ray, FastAPI, the full
langchain_core) into a module that must stay light, or when the CLI loads a subcommand on
demand.

:data:`ALLOWED` names each such (importer, imported) pair with its reason. A new function-local
import fails, and so does an allowed one that is gone ("remove it"), so the table only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from package_graph import all_modules, import_targets, is_type_checking

PKG = "langchain_ascend."
TORCH = "loads torch at import; the importer stays torch-free until the call needs it"

ALLOWED: dict[tuple[str, str], str] = {
    (PKG + "app.cli", PKG + "platform"):
        "`info` only; --version and --help stay at the CLI's ~85 modules",
    (PKG + "app.cli", PKG + "app.demo"): "the demo command loads langchain_core",
    (PKG + "app.cli", PKG + "app.doctor"): "the doctor command loads numpy (GGUF headers)",
    (PKG + "app.cli", PKG + "native.build"): "demo and serve only (their early kernel compile)",
    (PKG + "app.cli", PKG + "native.stack_kernel"):
        "demo and serve only (their early kernel compile)",
    (PKG + "app.cli", PKG + "serve.serve_command"):
        "the serve command loads FastAPI (the serve extra) and the chat model",
    (PKG + "chat.engines", PKG + "engine.shared_engines"):
        "the engine's stack (scheduler, runner, kernels: ~55 modules) loads with the first "
        "model, not with `import langchain_ascend.chat_models`",
    (PKG + "engine.cpu.fused_projections", PKG + "quant.linear"): TORCH,
    (PKG + "engine.cpu.quantized_layout", PKG + "quant.linear"): TORCH,
    (PKG + "observe.timeline", PKG + "observe.attach"):
        "langchain_core's tracer hooks (langsmith, requests), needed only inside `with`",
    (PKG + "quant.gguf_model", PKG + "quant.embedding"): TORCH,
    (PKG + "quant.gguf_model", PKG + "quant.linear"): TORCH,
    (PKG + "quant.quantize_model", PKG + "quant.embedding"): TORCH,
    (PKG + "quant.quantize_model", PKG + "quant.linear"): TORCH,
    (PKG + "serve.ray", PKG + "serve.ray.ray_app"): "imports Ray (the ray extra)",
    (PKG + "serve.ray.ray_command", PKG + "serve.ray.ray_app"): "imports Ray (the ray extra)",
    (PKG + "structured.selection", PKG + "structured.xgrammar_backend"):
        "imports xgrammar, which loads torch and transformers",
}


def _local_import_nodes(node: ast.AST, in_function: bool = False) -> Iterator[ast.AST]:
    """Import statements inside function bodies under ``node``, ``if TYPE_CHECKING:`` blocks
    left out (they never run)."""
    for child in ast.iter_child_nodes(node):
        if is_type_checking(child):
            for other in child.orelse:  # type: ignore[attr-defined]
                yield from _local_import_nodes(other, in_function)
            continue
        if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
        yield from _local_import_nodes(child, inside)


def function_local_imports() -> set[tuple[str, str]]:
    """(importer, imported) for every package module imported inside a function."""
    found: set[tuple[str, str]] = set()
    for name, path in all_modules().items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _local_import_nodes(tree):
            found.update((name, target) for target in import_targets(name, node))
    return found


def test_local_imports_are_found():
    found = function_local_imports()
    assert (PKG + "structured.selection", PKG + "structured.xgrammar_backend") in found
    assert (PKG + "app.cli", PKG + "app.doctor") in found  # `from x import main as y`
    assert (PKG + "app.cli", PKG + "errors") not in found  # imported at the top


def test_package_modules_are_imported_at_the_top():
    found = function_local_imports()
    new = sorted(found - set(ALLOWED))
    assert not new, ("imports of package modules inside functions (move them to the top, or "
                     f"add them to ALLOWED with the heavy dependency they defer): {new}")
    gone = sorted(set(ALLOWED) - found)
    assert not gone, f"allowed function-local imports that are gone (remove them): {gone}"
