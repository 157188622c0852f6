"""The environment deterministic mode asks for before torch is imported (torch-free: the `rillet
serve` command sets it before anything loads torch). See mkl.py for why."""

from __future__ import annotations

import os

ENV_VAR = "MKL_CBWR"
STRICT_VALUE = "AUTO,STRICT"


def request_strict_mkl() -> None:
    """MKL's strict reproducibility from its first call on; a value the user set wins."""
    os.environ.setdefault(ENV_VAR, STRICT_VALUE)
