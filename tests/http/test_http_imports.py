"""http/ stays an implicit namespace package that never imports torch, and never shadows stdlib `http`."""

from __future__ import annotations

import ast
import subprocess
import sys

from repo import REPO

HTTP = REPO / "http"


def test_http_has_no_init_and_no_torch_import() -> None:
    assert not (HTTP / "__init__.py").exists()
    for path in sorted(HTTP.rglob("*.py")):  # every layer, subfolders included
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path


def test_stdlib_http_wins_from_the_repo_root() -> None:
    code = "import aiohttp, http.client, rillet.http; assert hasattr(http, 'HTTPStatus')"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_server_modules_load_without_torch() -> None:
    code = (
        "import sys, rillet.http.app, rillet.http.cli, rillet.http.background; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
