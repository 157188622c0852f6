"""The default model behind a real HTTP server, and an `openai` client for it: one server per test
module here (the engine itself is the session's `default_engine`, tests/http/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from http_helpers import serving
from rillet.http.background import BackgroundServer


@pytest.fixture(scope="module")
def server(default_engine: Any) -> Iterator[BackgroundServer]:
    with serving(default_engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(server: BackgroundServer) -> str:
    assert server.state.engine is not None
    return server.state.engine.model_name
