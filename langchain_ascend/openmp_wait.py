"""How long an idle OpenMP thread busy-waits before it sleeps, bounded before torch loads.

torch's CPU threads and our native kernels (``langchain_ascend.native``) share GNU OpenMP
(libgomp), whose default is to spin at every barrier for up to 300,000 pause loops (several
milliseconds) before sleeping. On an idle machine that is free; on a busy one -- an agent's
own tools running beside the model, a second process, a browser on a 2-core laptop -- a
spinning thread burns the time slice the thread it waits for needs, and every step waits a
scheduler quantum at each of its barriers: on the shared 2-core VM of
``docs/performance.md`` SmolLM2's prefill took 3-7x and its decode 2.5-3x longer with the
default than with ``GOMP_SPINCOUNT=1000`` (about 20 microseconds of spinning), which costs
nothing measurable on an idle one.

libgomp reads its environment once, when it is loaded, so :func:`bound_spinning` runs when
this package is imported (``langchain_ascend/__init__.py``) and sets ``GOMP_SPINCOUNT`` only
where the user has set neither it nor ``OMP_WAIT_POLICY`` and no module that loads libgomp
(torch) is imported yet; otherwise it changes nothing. Pure apart from the environment.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

SPIN_COUNT = "1000"
"""``GOMP_SPINCOUNT`` set by default: pause loops before an idle OpenMP thread sleeps."""

USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
"""Variables by which a user chooses the wait policy (either one: we leave both alone)."""

LOADS_LIBGOMP = ("torch",)
"""Modules whose import has already loaded libgomp (too late to set its environment)."""


def bound_spinning(environ: MutableMapping[str, str] | None = None,
                   modules: Mapping[str, object] | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` where nothing else chose the wait policy
    and libgomp is not loaded yet; returns whether it was set."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if any(name in environ for name in USER_SETTINGS):
        return False
    if any(name in modules for name in LOADS_LIBGOMP):
        return False
    environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True
