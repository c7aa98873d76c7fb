"""A model folder's tokenizer, loaded by the class its ``tokenizer_config.json`` names.

``AutoTokenizer`` reads the folder's model config to choose a tokenizer class, and resolving a
``model_type`` imports that family's transformers config module, which pulls in much of the
library (~1.3 s on a 2-core machine, ``benchmarks/load_stages.py``). A folder whose
``tokenizer_config.json`` names the plain ``tokenizers`` backend (every GGUF-backed folder,
``engine.model_source.gguf_blocks``) is loaded by that class directly: the same object
``AutoTokenizer`` returns, without the config. Any other folder goes through ``AutoTokenizer``.
"""

from __future__ import annotations

import json
import os
from typing import Any

TOKENIZERS_BACKEND = "TokenizersBackend"
"""transformers' class of a tokenizer that is a ``tokenizers`` ``tokenizer.json`` alone."""


def load_folder_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer of the model folder ``path`` (module docstring).

    Raises:
        OSError, ValueError: As ``from_pretrained`` does for an unreadable folder.
    """
    folder = os.fspath(path)
    if _tokenizer_class(folder) == TOKENIZERS_BACKEND:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _tokenizer_class(folder: str) -> str | None:
    """``tokenizer_class`` of the folder's ``tokenizer_config.json``, or None."""
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as handle:
            value = json.load(handle).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None
