"""What a save keeps of the other saved steps (graphs/aot/store.py): another config's steps stay
(switching back loads them), those of older code or another torch go.

Each ArtifactStore stands for one process (a server start, a compile child); the libraries are
bytes of a known size: nothing is compiled.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from rillet.graphs.aot.key import ArtifactKey, make_key
from rillet.graphs.aot.store import MANIFEST, ArtifactStore

LIBRARY_BYTES = 100_000  # the manifest's few hundred bytes beside it do not change which fits


def _key(**changes: Any) -> ArtifactKey:
    return dataclasses.replace(make_key("decode", "weights", "kv-float32", "code-1", "default"), **changes)


def _save(store: ArtifactStore, key: ArtifactKey) -> Path:
    library = store.root.parent / "built.so"
    library.write_bytes(os.urandom(LIBRARY_BYTES))
    store.save(key, library, 1.0)
    return store.folder(key)


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
