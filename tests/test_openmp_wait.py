"""The package bounds OpenMP's busy-wait before torch loads, and only where nobody chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from langchain_ascend.openmp_wait import SPIN_COUNT, bound_spinning


def test_sets_the_spin_count_where_nothing_chose_it():
    environ: dict[str, str] = {"PATH": "/bin"}
    assert bound_spinning(environ, {}) is True
    assert environ["GOMP_SPINCOUNT"] == SPIN_COUNT


@pytest.mark.parametrize("setting", [{"GOMP_SPINCOUNT": "300000"},
                                     {"OMP_WAIT_POLICY": "ACTIVE"}])
def test_a_users_own_setting_wins(setting):
    environ = dict(setting)
    assert bound_spinning(environ, {}) is False
    assert environ == setting


def test_too_late_once_torch_is_loaded():
    environ: dict[str, str] = {}
    assert bound_spinning(environ, {"torch": object()}) is False
    assert "GOMP_SPINCOUNT" not in environ


def _spin_count_after(code: str, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", code + "; import os; "
                          "print(os.environ.get('GOMP_SPINCOUNT', 'unset'))"],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_importing_the_package_first_sets_it_for_the_process():
    assert _spin_count_after("import langchain_ascend") == SPIN_COUNT
    assert _spin_count_after("import langchain_ascend", GOMP_SPINCOUNT="7") == "7"
    assert _spin_count_after("import torch, langchain_ascend") == "unset"
