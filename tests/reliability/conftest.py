"""The reliability tests share tests/http's helpers (http_helpers, proc_helpers, fake_engine)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "http"))
