"""Packaging: `rillet.*` maps the top-level folders, and nothing shadows the standard library."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_from_repo_root_does_not_shadow_stdlib_http() -> None:
    # `python -c` puts the working directory first on sys.path: the repo's http/ must not win.
    code = (
        "import aiohttp, rillet.core, rillet.http, rillet.graphs, http, os; "
        f"assert not http.__file__.startswith({str(REPO)!r} + os.sep), http.__file__"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not (REPO / "http" / "__init__.py").exists()


def test_wheel_holds_the_three_packages_and_nothing_else(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("rillet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if n.endswith(".py")]
    assert (
        "rillet/core/engine.py" in code
        and "rillet/http/server.py" in code
        and "rillet/graphs/runner.py" in code
    )
    for sub in ("attention", "loaders", "model", "quant", "tokenizer"):  # core's subpackages ship too
        assert f"rillet/core/{sub}/__init__.py" in code, sub
    assert all(n.startswith(("rillet/core/", "rillet/http/", "rillet/graphs/")) for n in code), code
    assert not any(n.endswith("setup.py") or n.startswith(("tests/", "bench/")) for n in names)
    # the browser page (http/ui/routes.py) is package data: every static file ships, byte for byte
    static = sorted(p.name for p in (REPO / "http" / "static").iterdir())
    assert "index.html" in static and "app.js" in static
    with zipfile.ZipFile(wheel) as zf:
        for name in static:
            assert zf.read(f"rillet/http/static/{name}") == (REPO / "http" / "static" / name).read_bytes()
