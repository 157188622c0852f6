"""What a save keeps of the other saved steps (graphs/aot/store.py): another config's steps stay
(switching back loads them), those of older code or another torch go, and past
`graphs.artifacts_max_gb` the least recently used go first, never this process's own.

Each ArtifactStore stands for one process (a server start, a compile child); the libraries are
bytes of a known size: nothing is compiled.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.graph_setup import artifact_plan
from rillet.graphs.aot.key import ArtifactKey, make_key
from rillet.graphs.aot.store import GIB, MANIFEST, ArtifactStore

LIBRARY_BYTES = 100_000  # the manifest's few hundred bytes beside it do not change which fits


def _key(**changes: Any) -> ArtifactKey:
    return dataclasses.replace(make_key("decode", "weights", "kv-float32", "code-1", "default"), **changes)


def _save(store: ArtifactStore, key: ArtifactKey) -> Path:
    library = store.root.parent / "built.so"
    library.write_bytes(os.urandom(LIBRARY_BYTES))
    store.save(key, library, 1.0)
    return store.folder(key)


def _last_used(folder: Path, seconds_ago: float) -> None:
    then = time.time() - seconds_ago
    os.utime(folder / MANIFEST, (then, then))


@pytest.mark.parametrize(
    "variant",
    [{"layout": "kv-int8"}, {"layout": "block-32"}, {"model": "other-weights"}, {"mode": "max-autotune"}],
    ids=["kv-dtype", "block-size", "model", "compile-mode"],
)
def test_default_then_a_variant_then_default_keeps_both(tmp_path: Path, variant: dict[str, str]) -> None:
    root = tmp_path / "compiled"
    default, other = _key(), _key(**variant)
    _save(ArtifactStore(root), default)  # first start: builds the default config's step
    _save(ArtifactStore(root), other)  # `--set cache.dtype=int8`: builds its own
    third = ArtifactStore(root)  # the default again
    assert third.find(default) is not None
    assert third.find(other) is not None  # and back to the variant would load it too


@pytest.mark.parametrize("field", ["code", "torch"])
def test_a_new_code_or_torch_deletes_the_old_build(
    tmp_path: Path, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "compiled"
    old = _key()
    int8 = _key(layout="kv-int8", **{field: "new"})  # the int8 config, already rebuilt
    _save(ArtifactStore(root), old)
    _save(ArtifactStore(root), int8)
    new = _key(**{field: "new"})
    with caplog.at_level(logging.INFO, logger="rillet.graphs.aot.store"):
        _save(ArtifactStore(root), new)
    after = ArtifactStore(root)
    assert not after.folder(old).exists()
    assert after.find(new) is not None and after.find(int8) is not None
    assert f"superseded (other {field})" in caplog.text and str(after.folder(old)) in caplog.text


def test_a_step_of_the_previous_format_is_superseded(tmp_path: Path) -> None:
    """Before `layout` the config's part of the key was inside `code`: such a step is judged on
    the fields every format has, and never loaded again."""
    store = ArtifactStore(tmp_path / "compiled")
    old = _save(store, _key(format="rillet-aot-1", code="config-and-code"))
    manifest = json.loads((old / MANIFEST).read_text())
    del manifest["key"]["layout"]
    (old / MANIFEST).write_text(json.dumps(manifest))
    other_threads = _save(store, _key(format="rillet-aot-1", threads=_key().threads + 1))
    _save(ArtifactStore(store.root), _key())
    assert not old.exists() and other_threads.exists()


def test_past_the_bound_the_least_recently_used_goes_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "compiled"
    bound = int(2.5 * LIBRARY_BYTES)  # two steps fit, three do not
    a, b, c = _key(layout="a"), _key(layout="b"), _key(layout="c")
    folder_a, folder_b = _save(ArtifactStore(root, bound), a), _save(ArtifactStore(root, bound), b)
    _last_used(folder_a, 200)
    _last_used(folder_b, 100)
    assert ArtifactStore(root, bound).find(a) is not None  # a start on `a`: now b is the oldest use
    with caplog.at_level(logging.INFO, logger="rillet.graphs.aot.store"):
        _save(ArtifactStore(root, bound), c)
    assert folder_a.exists() and not folder_b.exists() and ArtifactStore(root).folder(c).exists()
    evicted = [r.getMessage() for r in caplog.records if "evicting" in r.getMessage()]
    assert len(evicted) == 1 and str(folder_b) in evicted[0], caplog.text
    assert "least recently used" in evicted[0] and "graphs.artifacts_max_gb" in evicted[0]


def test_the_bound_spares_what_this_process_uses(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server's loaded step and a build's steps (the first while it saves the second) stay, even
    when they are the oldest; others go, and when this process's steps alone are over the bound,
    a warning says so."""
    root = tmp_path / "compiled"
    bound = int(1.5 * LIBRARY_BYTES)
    loaded, unused = _key(layout="loaded"), _key(layout="unused")
    _save(ArtifactStore(root), loaded)
    _save(ArtifactStore(root), unused)
    server = ArtifactStore(root, bound)
    assert server.find(loaded) is not None
    _last_used(server.folder(loaded), 300)
    _last_used(server.folder(unused), 200)
    decode, verify = _key(), _key(graph="verify")
    server.hold([decode, verify])  # its SavedSteps names both before it builds them
    with caplog.at_level(logging.INFO, logger="rillet.graphs.aot.store"):
        _save(server, decode)
        _save(server, verify)
    assert not server.folder(unused).exists()
    assert all(server.folder(k).exists() for k in (loaded, decode, verify))
    assert "over graphs.artifacts_max_gb" in caplog.text and "kept" in caplog.text


def test_the_bound_is_a_config_key(tmp_path: Path) -> None:
    cfg = config_from_dict({"model": {"cache_dir": str(tmp_path)}}, ["graphs.artifacts_max_gb=3"])
    plan = artifact_plan(cfg, _NoLora())  # type: ignore[arg-type]
    assert plan is not None and plan.store.max_bytes == 3 * GIB
    with pytest.raises(ConfigError) as err:
        config_from_dict({}, ["graphs.artifacts_max_gb=-1"])
    assert err.value.key == "graphs.artifacts_max_gb"


class _NoLora:
    lora = None
