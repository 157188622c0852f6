"""The tensor-parallel tests use tests/http's helpers (http_helpers: in-process servers)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "http"))
