"""Packaging: `rillet.*` maps the top-level folders, and nothing shadows the standard library."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import urllib.request
import zipfile
from pathlib import Path

import pytest
from repo import REPO


def test_import_from_repo_root_does_not_shadow_stdlib_http() -> None:
    # `python -c` puts the working directory first on sys.path: the repo's http/ must not win.
    code = (
        "import aiohttp, rillet.core, rillet.http, rillet.graphs, http, os; "
        f"assert not http.__file__.startswith({str(REPO)!r} + os.sep), http.__file__"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not (REPO / "http" / "__init__.py").exists()


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{args}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    # --no-build-isolation: setuptools from this venv (no download); the build tree goes to build/
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        dist,
        ".",
        cwd=REPO,
    )
    (found,) = dist.glob("rillet-*.whl")
    return found


def test_the_wheel_holds_every_module_and_static_file(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n for n in names if n.endswith(".py")}
    source = {
        f"rillet/{p.relative_to(REPO).as_posix()}"
        for top in ("core", "http", "graphs")
        for p in (REPO / top).rglob("*.py")
    }
    assert shipped == source
    assert not any(n.startswith(("tests/", "bench/")) or n in ("setup.py", "rillet/setup.py") for n in names)
    static = REPO / "http" / "ui" / "static"
    files = sorted(p.name for p in static.iterdir())
    assert "index.html" in files and "app.js" in files
    with zipfile.ZipFile(wheel) as zf:  # the browser page is package data: byte for byte
        for name in files:
            assert zf.read(f"rillet/http/ui/static/{name}") == (static / name).read_bytes()


IMPORT_ALL = """
import importlib, pathlib, sys
import rillet.core
root = pathlib.Path(rillet.core.__file__).resolve().parents[1]
assert root.parent.name == "site-packages" and not str(root).startswith(sys.argv[1]), root
names = sorted(
    ".".join(("rillet", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
    for p in root.rglob("*.py")
)
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_an_installed_wheel_imports_every_module_and_serves(wheel: Path, tmp_path: Path) -> None:
    """`pip install` of the wheel (not editable) into a fresh venv, run from outside the repo: the
    dependencies come from the project's venv as a plain path entry (its .pth files, the editable
    install's among them, are not processed), rillet only from the wheel."""
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    py = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run(py, "-c", purelib).stdout.strip())
    (site / "project-deps.pth").write_text(_run(sys.executable, "-c", purelib).stdout.strip() + "\n")
    _run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", wheel)
    imported = _run(py, "-c", IMPORT_ALL, str(REPO), cwd=tmp_path)
    assert int(imported.stdout.split()[-1]) == sum(
        len(list((REPO / d).rglob("*.py"))) for d in ("core", "http", "graphs")
    )
    srv = subprocess.Popen(
        [venv / "bin" / "rillet", "serve", "--port", "0", "--set", "model.kind=synthetic"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        port = _wait_ready(srv)
        body = {"model": "synthetic", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
        assert answer["choices"][0]["message"]["content"] and answer["usage"]["completion_tokens"] == 4
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as resp:
            assert b"<html" in resp.read().lower()  # the page, from the installed package data
    finally:
        srv.send_signal(signal.SIGTERM)
        assert srv.wait(60) == 0


def _wait_ready(srv: subprocess.Popen[str]) -> int:
    """The port from the "listening on" line, once the banner says the model is served."""
    assert srv.stderr is not None
    port = 0
    lines = []
    for line in srv.stderr:
        lines.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "ready: serving" in line:
            threading.Thread(target=srv.stderr.read, daemon=True).start()  # keep the pipe drained
            return port
    raise AssertionError("".join(lines))
