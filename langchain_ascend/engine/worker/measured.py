"""Warm-up's measurements of a loaded model on this machine, cached on disk.

Some choices depend on how fast this CPU runs this model (a drafted row's cost in a decode
pass, ``engine.worker.draft_cost``); they are measured once and kept, one JSON file per
:func:`measure_key` (model fingerprint, shape, what, versions, CPU, threads), written to a
temporary name and renamed: a reader never sees half a file, and an unreadable file is
ignored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform as host_platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_ascend._version import __version__
from langchain_ascend.cache_dir import MEASURED, cache_subdir

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

CACHE_ENV_VAR = "LANGCHAIN_ASCEND_MEASURED_CACHE"
CHECKSUM_ELEMENTS = 4096
"""Leading elements of each checksummed weight."""


def model_fingerprint(model: Any, dtype: torch.dtype, weight_layout: str | None) -> str:
    """A hash of what makes two loaded models the same for timing: config, dtype, CPU weight
    layout, every parameter's name and shape, and the leading elements of the first, middle
    and last parameters."""
    import torch

    params = list(model.named_parameters())
    digest = hashlib.sha256()
    digest.update(model.config.to_json_string(use_diff=False).encode())
    digest.update(f"{dtype}|{weight_layout}".encode())
    for name, param in params:
        digest.update(f"{name}:{tuple(param.shape)}".encode())
    for index in sorted({0, len(params) // 2, len(params) - 1}):
        head = params[index][1].detach().reshape(-1)[:CHECKSUM_ELEMENTS]  # (<= 4096,)
        head = head.to("cpu", torch.float32)
        digest.update(head.contiguous().numpy().tobytes())
    return digest.hexdigest()


def cpu_model() -> str:
    """The CPU's model string: ``platform.processor()``, else ``/proc/cpuinfo``'s model name."""
    name = host_platform.processor()
    if name:
        return name
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return host_platform.machine()


def measure_key(model_key: str, bucket: tuple[int, int], what: str) -> dict[str, Any]:
    """Everything a cached measurement depends on (module docstring)."""
    import torch

    return {"model": model_key, "bucket": list(bucket), "backend": what,
            "torch": torch.__version__, "package": __version__,
            "cpu": cpu_model(), "threads": torch.get_num_threads()}


def cache_dir() -> Path:
    """``$LANGCHAIN_ASCEND_MEASURED_CACHE``, else ``<cache root>/measured``
    (:func:`langchain_ascend.cache_dir.cache_subdir`; not created)."""
    return cache_subdir(MEASURED, override_env=CACHE_ENV_VAR)


def cache_path(key: dict[str, Any]) -> Path:
    """The file of the measurement for ``key``."""
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / f"{name}.json"


def _read_record(key: dict[str, Any], what: str) -> dict[str, Any] | None:
    """The cache file's record for ``key``, or None (none yet, or unreadable: logged at
    debug, naming ``what`` it holds)."""
    path = cache_path(key)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("key") != key:
            raise ValueError("the file holds another key")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        logger.debug("ignoring the %s cache file %s: %s", what, path, exc)
        return None
    return data


def _write_record(key: dict[str, Any], record: dict[str, Any]) -> None:
    """Write ``record`` (with ``key``) atomically (temporary file, then rename); an
    unwritable cache is logged at debug and skipped."""
    path = cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as out:
                json.dump({"key": key, **record}, out, indent=1, sort_keys=True)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
    except OSError as exc:
        logger.debug("could not write the cache file %s: %s", path, exc)


def load_measured(key: dict[str, Any]) -> float | None:
    """A measured number cached for ``key`` (:func:`store_measured`), or None."""
    data = _read_record(key, "measurement")
    value = None if data is None else data.get("value")
    return float(value) if isinstance(value, int | float) else None


def store_measured(key: dict[str, Any], value: float) -> None:
    """Cache a measured number (a drafted row's cost...) for ``key``."""
    _write_record(key, {"value": float(value)})
