"""Where the server says it is: URLs a client can use, for IPv6 hosts too; a socket it cannot open
is one line naming the keys, exit 1."""

from __future__ import annotations

import logging
import socket

import pytest
from rillet.core.config import config_from_dict
from rillet.http.cli import main
from rillet.http.launch.banner import base_url, ready_banner


def test_an_ipv6_host_is_bracketed_in_urls() -> None:
    assert base_url("::1", 8000) == "http://[::1]:8000"  # was http://::1:8000
    assert base_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    banner = ready_banner(config_from_dict({}, ["server.host=::1"]), "m", 64, 4, "::1", 8000)
    assert "at http://[::1]:8000/v1" in banner and "curl http://[::1]:8000/v1/chat" in banner
    assert "at http://127.0.0.1:8000/v1" in ready_banner(config_from_dict({}), "m", 64, 4, "::", 8000)


def test_a_port_in_use_is_one_line_naming_the_keys(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="rillet.serve"):
            rc = main(["serve", "--port", str(port), "--set", "model.kind=synthetic"])
    assert rc == 1
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"server.port={port}" in line and "server.host='127.0.0.1'" in line and "in use" in line
