"""MKL's conditional numerical reproducibility (CNR) in strict mode, set from inside the process.

Measured on this project's CPUs (see bench/engine/determinism_cost.py and the tests): a float32
MKL gemm gives an output row the same bits whatever the other rows when it has at least 4 rows
under `MKL_CBWR=AUTO,STRICT`, and only when the row count is a multiple of 16 without it (MKL picks
its kernel, and splits the rows between threads, by the row count). STRICT must be in force before
MKL's first call: the environment variable works if it is set before torch is imported (the
`rillet serve` command does that), and `mkl_cbwr_set` works later as long as no MKL routine has run
yet in the process. Once MKL has run neither does, and the caller pads to 16 rows instead.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch
from rillet.core.determinism.env import ENV_VAR, STRICT_VALUE

log = logging.getLogger(__name__)

_AUTO = 2  # MKL_CBWR_AUTO
_STRICT = 0x10000  # MKL_CBWR_STRICT
_ALL = -1  # MKL_CBWR_ALL: mkl_cbwr_get's "the whole setting"


def _mkl() -> ctypes.CDLL | None:
    """torch's CPU library, where MKL is linked in statically (its service functions exported)."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        dll = ctypes.CDLL(str(lib))
        dll.mkl_serv_cbwr_get.restype = ctypes.c_int
        dll.mkl_serv_cbwr_set.restype = ctypes.c_int
    except (OSError, AttributeError):  # another platform or build: no MKL symbols to call
        return None
    return dll


def strict_in_force() -> bool:
    """Whether MKL runs in strict CNR mode now."""
    dll = _mkl()
    return dll is not None and bool(dll.mkl_serv_cbwr_get(ctypes.c_int(_ALL)) & _STRICT)


def ensure_strict() -> bool:
    """Puts MKL in strict CNR mode if it is not yet; True if it is in force afterwards."""
    dll = _mkl()
    if dll is None:
        return False
    if dll.mkl_serv_cbwr_get(ctypes.c_int(_ALL)) & _STRICT:
        return True
    status = dll.mkl_serv_cbwr_set(ctypes.c_int(_AUTO | _STRICT))
    if status != 0:  # MKL_CBWR_ERR_MODE_CHANGE_FAILURE: it has run already
        log.info(
            "MKL strict reproducibility could not be set (MKL already ran in this process); "
            "set %s=%s before importing torch for the cheaper row padding",
            ENV_VAR,
            STRICT_VALUE,
        )
    return strict_in_force()
