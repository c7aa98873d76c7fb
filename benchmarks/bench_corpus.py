"""Offline text the benchmarks share: this repository's documentation, concatenated.

Prompts for the speed benchmarks and the perplexity text both come from here: no download,
the same bytes on every machine that has the checkout (README.md, then docs/*.md sorted)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def docs_files(skip: tuple[str, ...] = ()) -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in files if p.name not in skip and p.exists()]


def docs_text(skip: tuple[str, ...] = ()) -> str:
    """The files of :func:`docs_files` joined by blank lines; ``skip``: names left out (the
    perplexity text leaves out ``performance.md``, which every benchmark run edits)."""
    return "\n\n".join(p.read_text(encoding="utf-8") for p in docs_files(skip))
