"""The package version, in one place: ``pyproject.toml`` reads it (setuptools' dynamic
``attr:``), ``langchain_ascend.__version__`` and the compile-choice cache key import it.

A leaf module: it imports nothing, so reading the version loads neither torch nor the package's
lazy classes.
"""

__version__ = "0.1.0"
