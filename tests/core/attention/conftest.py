"""The `fake_flashinfer` fixture of the flashinfer backend's CPU tests: the stand-in module of
tests/support/core_helpers/fake_flashinfer.py in sys.modules in place of the real `flashinfer`."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
from core_helpers.fake_flashinfer import FakeDecodeWrapper, FakePrefillWrapper


@pytest.fixture
def fake_flashinfer(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = FakeDecodeWrapper  # type: ignore[attr-defined]
    mod.BatchPrefillWithPagedKVCacheWrapper = FakePrefillWrapper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    yield mod
