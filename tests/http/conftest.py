"""Servers for the HTTP tests: real engines (synthetic, default model) and the fake one.

An engine has one ring and so one consumer: a server attaches on start and detaches on stop, and
session-scoped engines are shared by servers that never run at the same time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_engine import FakeEngine
from http_helpers import SYNTH_OVERRIDES, serving
from rillet.core.config import load_config
from rillet.http.background import BackgroundServer


@pytest.fixture(scope="session")
def synthetic_engine() -> Iterator[Any]:
    from rillet.core.engine.engine import Engine

    engine = Engine(load_config(None, SYNTH_OVERRIDES))
    engine.start()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def default_engine() -> Iterator[Any]:
    """The real default model (SmolLM2-135M, fp32 CPU): keep max_tokens small."""
    from rillet.core.engine.engine import Engine

    # quantization pinned to none: the default (auto) would run this model with int4 weights
    overrides = ["model.quantization=none", "model.max_model_len=512", "scheduler.max_num_seqs=8"]
    engine = Engine(load_config(None, overrides))
    engine.start()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def synth_server(synthetic_engine: Any) -> Iterator[BackgroundServer]:
    with serving(synthetic_engine) as srv:
        yield srv


@pytest.fixture
def make_fake() -> Iterator[Callable[..., FakeEngine]]:
    """Factory of started fake engines, shut down after the test."""
    made: list[FakeEngine] = []

    def make(*overrides: str, **kwargs: Any) -> FakeEngine:
        engine = FakeEngine(load_config(None, list(overrides)), **kwargs)
        engine.start()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown()
