"""Warm-up's choice between the compiled static decode step and the eager step, and its cache.

The pure parts of ``compile="auto"`` on the CPU (``engine.worker.compile`` runs them): the
rules (:func:`skip_reason` before compiling, :func:`decide` after), the record
(:class:`CompileChoice`) and its on-disk cache. A compiled CPU step still runs torch's linear
products, so an eager step already faster than them by :data:`MIN_SPEEDUP` is kept without
compiling. One JSON file per :func:`choice_key` (model, bucket, backend, versions, CPU,
threads), written to a temporary name and renamed: a reader never sees half a file. A compile
cannot be interrupted, so the budget (``$LANGCHAIN_ASCEND_COMPILE_BUDGET_S``) is checked
after it; over budget, eager is recorded. Details and measurements: docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform as host_platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_ascend._version import __version__
from langchain_ascend.cache_dir import COMPILE_CHOICE, cache_subdir

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

CACHE_ENV_VAR = "LANGCHAIN_ASCEND_COMPILE_CACHE"
BUDGET_ENV_VAR = "LANGCHAIN_ASCEND_COMPILE_BUDGET_S"
DEFAULT_BUDGET_S = 300.0
MIN_SPEEDUP = 0.05
"""The compiled step is kept only when it takes at most ``1 - MIN_SPEEDUP`` of eager's time."""
CHECKSUM_ELEMENTS = 4096
"""Leading elements of each checksummed weight."""
CHOICES = ("compiled", "eager")


@dataclass(frozen=True)
class CompileChoice:
    """What ``compile="auto"`` chose for the decode step at warm-up, and why.

    Attributes:
        chosen: ``"compiled"`` or ``"eager"``.
        reason: One sentence: why.
        bucket: The ``(rows, table width)`` bucket measured.
        eager_ms: Median eager step time, or None (not measured).
        compiled_ms: Median compiled step time, or None (not measured).
        compile_s: Seconds the compile (and its first run) took, or None (not compiled).
        cached: Read from the decision cache rather than measured in this process.
        products_ms: Torch's products alone at the bucket's rows (module docstring), or
            None (not measured).
    """

    chosen: str
    reason: str
    bucket: tuple[int, int]
    eager_ms: float | None = None
    compiled_ms: float | None = None
    compile_s: float | None = None
    cached: bool = False
    products_ms: float | None = None

    def __post_init__(self) -> None:
        if self.chosen not in CHOICES:
            raise ValueError(f"chosen must be one of {CHOICES}, got {self.chosen!r}")

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values."""
        return {**dataclasses.asdict(self), "bucket": list(self.bucket)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompileChoice:
        """The inverse of :meth:`as_dict`.

        Raises:
            ValueError, TypeError, KeyError: ``data`` is not a choice.
        """
        rows, width = data["bucket"]
        fields = {f.name for f in dataclasses.fields(cls)} - {"bucket"}
        unknown = set(data) - fields - {"bucket"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        return cls(bucket=(int(rows), int(width)), **{k: data[k] for k in fields if k in data})

    def summary(self) -> str:
        """One line for logs: what runs, both times and the reason."""
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f} ms"

        compile_part = "" if self.compile_s is None else f", compile {self.compile_s:.1f} s"
        products = "" if self.products_ms is None else f", torch's products {ms(self.products_ms)}"
        cached = " (cached decision)" if self.cached else ""
        return (f"decode step at bucket {self.bucket} runs {self.chosen}: eager "
                f"{ms(self.eager_ms)}, compiled {ms(self.compiled_ms)}{compile_part}{products}; "
                f"{self.reason}{cached}")


def skip_reason(eager_ms: float, products_ms: float) -> str | None:
    """The rule before compiling: why a compiled step cannot win, or None (compile and
    measure; pure function).

    A compiled CPU step still runs torch's products (module docstring), so it takes at least
    ``products_ms``; it is kept only at ``(1 - MIN_SPEEDUP) * eager_ms`` or less (:func:`decide`).
    Nothing is compiled when ``eager_ms <= (1 - MIN_SPEEDUP) * products_ms``: the eager step
    beats the products alone with the same margin.

    Args:
        eager_ms: The eager step's time.
        products_ms: Torch's products alone at the same rows.
    """
    if eager_ms <= (1.0 - MIN_SPEEDUP) * products_ms:
        return (f"the eager step ({eager_ms:.1f} ms) already beats torch's products alone "
                f"({products_ms:.1f} ms), which a compiled step still runs: not compiled")
    return None


def decide(bucket: tuple[int, int], *, eager_ms: float | None, compiled_ms: float | None,
           compile_s: float | None, problem: str | None, budget_s: float) -> CompileChoice:
    """The rule: compiled only when nothing went wrong (every greedy token agreed), the compile
    fit the budget and the compiled step is at least :data:`MIN_SPEEDUP` faster (pure
    function).

    Args:
        bucket: The bucket measured.
        eager_ms: Eager step time (None only with a ``problem``).
        compiled_ms: Compiled step time (None only with a ``problem``).
        compile_s: Seconds the compile took.
        problem: What went wrong (a failed compile, differing greedy tokens), or None.
        budget_s: The compile budget (module docstring).
    """
    def choice(chosen: str, reason: str) -> CompileChoice:
        return CompileChoice(chosen, reason, bucket, eager_ms=eager_ms, compiled_ms=compiled_ms,
                             compile_s=compile_s)

    if problem is not None:
        return choice("eager", f"the compiled step is unusable: {problem}")
    assert eager_ms is not None and compiled_ms is not None and compile_s is not None
    if compile_s > budget_s:
        return choice("eager", f"the compile took {compile_s:.0f} s, over the {budget_s:.0f} s "
                      f"budget ({BUDGET_ENV_VAR})")
    saved = 1.0 - compiled_ms / eager_ms if eager_ms > 0 else 0.0
    if saved >= MIN_SPEEDUP:
        return choice("compiled", f"compiled is {saved:.0%} faster")
    return choice("eager", f"compiled is not {MIN_SPEEDUP:.0%} faster ({saved:+.0%})")


def compile_budget_s() -> float:
    """``$LANGCHAIN_ASCEND_COMPILE_BUDGET_S`` in seconds (default :data:`DEFAULT_BUDGET_S`).

    Raises:
        ValueError: The variable is not a non-negative number.
    """
    raw = os.environ.get(BUDGET_ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also rejects nan
        raise ValueError(f"{BUDGET_ENV_VAR} must be a number of seconds >= 0, got {raw!r}")
    return value


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


def choice_key(model_key: str, bucket: tuple[int, int], backend: str) -> dict[str, Any]:
    """Everything a cached decision depends on (module docstring)."""
    import torch

    return {"model": model_key, "bucket": list(bucket), "backend": backend,
            "torch": torch.__version__, "package": __version__,
            "cpu": cpu_model(), "threads": torch.get_num_threads()}


def cache_dir() -> Path:
    """``$LANGCHAIN_ASCEND_COMPILE_CACHE``, else ``<cache root>/compile_choice``
    (:func:`langchain_ascend.cache_dir.cache_subdir`; not created)."""
    return cache_subdir(COMPILE_CHOICE, override_env=CACHE_ENV_VAR)


def cache_path(key: dict[str, Any]) -> Path:
    """The file of the decision for ``key``."""
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


def load_choice(key: dict[str, Any]) -> CompileChoice | None:
    """The cached decision for ``key``, or None (none yet, or unreadable: logged at debug)."""
    data = _read_record(key, "compile decision")
    if data is None:
        return None
    try:
        choice = CompileChoice.from_dict(data["choice"])
    except (ValueError, TypeError, KeyError) as exc:
        logger.debug("ignoring the compile decision cache file %s: %s", cache_path(key), exc)
        return None
    return dataclasses.replace(choice, cached=True)


def store_choice(key: dict[str, Any], choice: CompileChoice) -> None:
    """Write ``choice`` for ``key`` atomically (temporary file, then rename); an unwritable
    cache is logged at debug and skipped."""
    _write_record(key, {"choice": dataclasses.replace(choice, cached=False).as_dict()})


def load_measured(key: dict[str, Any]) -> float | None:
    """A measured number cached for ``key`` (:func:`store_measured`), or None."""
    data = _read_record(key, "measurement")
    value = None if data is None else data.get("value")
    return float(value) if isinstance(value, int | float) else None


def store_measured(key: dict[str, Any], value: float) -> None:
    """Cache a measured number (a drafted row's cost...) for ``key``, as a decision is."""
    _write_record(key, {"value": float(value)})
