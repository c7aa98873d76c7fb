"""Tiny models whose tokenizer spells the tool-call markers one of three ways.

Tool-tuned vocabularies differ in how a marker such as ``<tool_call>`` or ``[TOOL_CALLS]`` is
tokenized, and each way once broke reply parsing somewhere:

* ``"special"`` — one added token marked special (``decode(skip_special_tokens=True)`` drops it);
* ``"added"`` — one added token, not special;
* ``"plain"`` — no token of its own: the text is split into several ordinary tokens.

:func:`build_marker_model` copies a :func:`~langchain_ascend.testing.build_model` folder and
rewrites only the tokenizer's added-token table: a marker gets the id of an unused added token
(``<|box_start|>``...) or, for ``"plain"``, loses its added token (renamed), so the vocabulary
size and the weights stay the same.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from langchain_ascend.testing.cache import build_once, builder_fingerprint
from langchain_ascend.testing.model_builder import build_model

MARKER_KINDS: tuple[str, ...] = ("special", "added", "plain")

# Added tokens of the test vocabulary that no test prompt uses: ids a marker can take over.
_SPARE_TOKENS = ("<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
                 "<|object_ref_start|>", "<|object_ref_end|>", "<|vision_pad|>",
                 "<|video_pad|>")


def rewrite_markers(added_tokens: list[dict], markers: Sequence[str], kind: str) -> list[dict]:
    """The ``tokenizer.json`` ``added_tokens`` list with ``markers`` spelled as ``kind``.

    Pure: returns new entries. ``"special"``/``"added"``: each marker is one added token
    (an existing entry, else a spare one renamed) with that ``special`` flag; ``"plain"``: an
    existing entry for a marker is renamed so the marker's text splits into ordinary tokens.

    Raises:
        ValueError: An unknown ``kind``, or more new markers than spare tokens.
    """
    if kind not in MARKER_KINDS:
        raise ValueError(f"kind must be one of {list(MARKER_KINDS)}, got {kind!r}")
    entries = [dict(entry) for entry in added_tokens]
    by_content = {entry["content"]: entry for entry in entries}
    spares = [by_content[t] for t in _SPARE_TOKENS if t in by_content and t not in markers]
    for marker in markers:
        entry = by_content.get(marker)
        if kind == "plain":
            if entry is not None:
                entry["content"] = f"<|unused_{entry['id']}|>"
            continue
        if entry is None:
            if not spares:
                raise ValueError(f"no spare added token left for the marker {marker!r}")
            entry = spares.pop(0)
            entry["content"] = marker
        entry["special"] = kind == "special"
    return entries


def build_marker_model(kind: str, markers: Sequence[str], *, chat_template: str = "tools",
                       arch: str = "qwen2") -> Path:
    """A cached copy of the tiny ``arch`` model whose tokenizer spells ``markers`` as ``kind``
    (see the module docs); ``chat_template`` as in ``build_model``."""
    source = build_model("tiny", arch, chat_template=chat_template)
    fingerprint = builder_fingerprint(("marker_tokens.py",), source.name, kind, tuple(markers))
    final_dir = source.parent / f"{source.name}-markers-{kind}-{fingerprint}"

    def build(out_dir: Path) -> None:
        for item in source.iterdir():
            if item.is_file():
                shutil.copy2(item, out_dir / item.name)
        path = out_dir / "tokenizer.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        data["added_tokens"] = rewrite_markers(data["added_tokens"], markers, kind)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)

    return build_once(final_dir, build)
