"""The tests' GGUF writer: ``langchain_ascend.testing.gguf_writer`` (kept under this name for
the tests that import it from here)."""

from __future__ import annotations

from langchain_ascend.testing.gguf_writer import llama_cpp_rows, write_gguf

__all__ = ["llama_cpp_rows", "write_gguf"]
