"""Integration-test settings shared by every module here."""

from __future__ import annotations

import os

# compile="auto" on the CPU compiles and times the decode step at warm-up: minutes of inductor
# for SmolLM2 on two cores. Warm-ups here (the demo, agents) skip that measurement; compiled
# decoding on SmolLM2 is tested on its own in test_compiled_step_smollm2.py.
os.environ.setdefault("LANGCHAIN_ASCEND_COMPILE_BUDGET_S", "0")
