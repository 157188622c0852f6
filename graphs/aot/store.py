"""Compiled steps on disk: one folder per key, a library and the manifest that vouches for it.

    <root>/<graph>-<key digest>/step.so         the step's AOTInductor library
    <root>/<graph>-<key digest>/step.json       its custom ops' extern nodes, when it calls any
    <root>/<graph>-<key digest>/manifest.json   the key's fields, the files' sizes and sha256

A folder is written beside its place under a temporary name and renamed into it, so a reader sees
a whole artifact or none. On load everything is checked before a byte of machine code is mapped:
the manifest's key against this process's (another torch, ISA cap or thread count: refused), and
the library's size and digest against the manifest (truncated, flipped bytes: refused). A refused
artifact is logged as a warning, deleted, and reported as a miss, so the caller builds it anew.
A build works in `.build-<pid>-*` and saves through `.<graph>.<pid>.*.tmp`; the next build deletes
those of processes that are gone (a build killed mid-way, e.g. a server stopped during its first
start), never a live one's.

A save deletes what the new artifact supersedes (the same step and config built by other code or
another torch: never loaded again) and keeps variants (another KV dtype, model, thread count...),
which a restart with that config loads. The store is bounded by `max_bytes` instead: past it a
save evicts the least recently used artifacts first (the manifest's mtime is the last use: set at
save and at every find that vouches for it), never one this process holds (found, saved, or
named by `hold`: the steps it serves or builds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from rillet.graphs.aot.key import ArtifactKey

logger = logging.getLogger(__name__)

LIBRARY = "step.so"
EXTERN = "step.json"  # AOTInductor's runner looks for it beside the library, by the library's name
MANIFEST = "manifest.json"
BUILD_PREFIX = ".build-"  # .build-<pid>-<random>: one build's working folder (build_dir)
SAVE_SUFFIX = ".tmp"  # .<graph>.<pid>.<random>.tmp: an artifact being saved (save)
UNNAMED_BUILD_AGE_S = 3600.0  # a build folder without a pid (older rillet) is stale after this
GIB = 1 << 30


class ArtifactStore:
    def __init__(self, root: Path, max_bytes: int = 0) -> None:
        self.root = root
        self.max_bytes = max_bytes  # the artifacts' bound (graphs.artifacts_max_gb); 0: none
        self._held: set[Path] = set()  # folders this process uses: never evicted

    def folder(self, key: ArtifactKey) -> Path:
        return self.root / f"{key.graph}-{key.digest()}"

    def find(self, key: ArtifactKey) -> Path | None:
        """The library of `key` once it checks out, else None (a refused one is deleted)."""
        folder = self.folder(key)
        if not folder.exists():
            return None
        problem = _problem(folder, key)
        if problem is None:
            self._held.add(folder)
            with contextlib.suppress(OSError):  # a read-only store (an image's) keeps no use
                os.utime(folder / MANIFEST)
            return folder / LIBRARY
        self.discard(key, problem)
        return None

    def hold(self, keys: Iterable[ArtifactKey]) -> None:
        """Marks the artifacts of `keys` as this process's (saved or not yet): never evicted by
        its saves, e.g. a build's first step while it saves the second."""
        self._held.update(self.folder(key) for key in keys)

    def discard(self, key: ArtifactKey, why: str) -> None:
        """Deletes the artifact of `key`, with a warning saying why (it is rebuilt)."""
        folder = self.folder(key)
        logger.warning("compiled artifact %s refused (%s): deleted, it will be built again", folder, why)
        shutil.rmtree(folder, ignore_errors=True)

    def build_dir(self) -> Path:
        """A fresh folder under the root for one build's files, named for this process, so that a
        build killed before it cleaned up is found and deleted by the next (`sweep`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.sweep()
        path = self.root / f"{BUILD_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        return path

    def sweep(self) -> list[Path]:
        """Deletes the build and save folders of processes that are gone (a build killed mid-way
        leaves its folder: up to a whole library, ~190 MB for the default model); returns them."""
        gone = [path for path in self.root.glob(".*") if _stale(path)]
        for path in gone:
            shutil.rmtree(path, ignore_errors=True)
        if gone:
            logger.info("deleted %d folder(s) of builds that did not finish: %s", len(gone), gone)
        return gone

    def save(self, key: ArtifactKey, library: Path, seconds: float) -> Path:
        """Moves the built `library` into the artifact of `key`; returns its final path."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key.graph}.{os.getpid()}.{uuid.uuid4().hex[:8]}{SAVE_SUFFIX}"
        tmp.mkdir()
        try:
            shutil.move(str(library), tmp / LIBRARY)
            extern = library.with_suffix(".json")
            if extern.exists():
                shutil.move(str(extern), tmp / EXTERN)
            manifest = {
                "key": key.fields(),
                "library": _vouch(tmp / LIBRARY),
                "extern": _vouch(tmp / EXTERN) if (tmp / EXTERN).exists() else None,
                "build_s": round(seconds, 1),
                "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            folder = self.folder(key)
            shutil.rmtree(folder, ignore_errors=True)  # a stale one, or a concurrent builder's
            os.replace(tmp, folder)
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
        self._held.add(folder)
        self._prune(key)
        self._bound()
        return folder / LIBRARY

    def _prune(self, key: ArtifactKey) -> None:
        """Deletes the artifacts `key` supersedes (graphs/aot/key.py SUPERSEDING): its step and
        config built by other code or another torch (an upgrade; ~190 MB each for the default
        model). Variants this host may still start with (another KV dtype, thread count, model)
        are kept: the size bound (`_bound`) limits them."""
        for folder in self.root.glob(f"{key.graph}-*"):
            if folder == self.folder(key):
                continue
            try:
                stored = json.loads((folder / MANIFEST).read_text())["key"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not ours to judge: find() refuses it if its key ever comes up
            if isinstance(stored, dict) and key.supersedes(stored):
                other = "/".join(key.differs(stored))
                logger.info("deleting compiled artifact %s: superseded (other %s)", folder, other)
                shutil.rmtree(folder, ignore_errors=True)

    def _bound(self) -> None:
        """Evicts the least recently used artifacts until they take at most `max_bytes`, none
        that this process holds (a warning when those alone are over it)."""
        if not self.max_bytes:
            return
        artifacts = sorted(_artifacts(self.root))
        total = sum(size for _, size, _ in artifacts)
        for used, size, folder in artifacts:
            if total <= self.max_bytes:
                return
            if folder in self._held:
                continue
            logger.info(
                "evicting compiled artifact %s (%.0f MiB, last used %s): the saved steps take "
                "%.2f GiB, over graphs.artifacts_max_gb %.2f; the least recently used goes first",
                folder,
                size / (1 << 20),
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(used)),
                total / GIB,
                self.max_bytes / GIB,
            )
            shutil.rmtree(folder, ignore_errors=True)
            total -= size
        if total > self.max_bytes:
            logger.warning(
                "the compiled steps in use take %.2f GiB, over graphs.artifacts_max_gb %.2f: kept",
                total / GIB,
                self.max_bytes / GIB,
            )


def _artifacts(root: Path) -> list[tuple[float, int, Path]]:
    """(last use, bytes, folder) of each artifact under `root` (a folder with a manifest)."""
    found = []
    for folder in root.iterdir():
        if folder.name.startswith(".") or not folder.is_dir():
            continue  # builds and saves in progress (swept), build.log
        try:
            used = (folder / MANIFEST).stat().st_mtime
            size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        except OSError:  # no manifest (not ours), or deleted meanwhile by another process
            continue
        found.append((used, size, folder))
    return found


def _vouch(path: Path) -> dict[str, object]:
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def _problem(folder: Path, key: ArtifactKey) -> str | None:
    """Why the artifact in `folder` cannot stand for `key`, or None when it can."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        stored_key = manifest["key"]
        files = {LIBRARY: manifest["library"]}
        if manifest.get("extern") is not None:
            files[EXTERN] = manifest["extern"]
        sizes = {name: (int(f["bytes"]), str(f["sha256"])) for name, f in files.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"no readable manifest: {type(exc).__name__}"
    differs = key.differs(stored_key) if isinstance(stored_key, dict) else ["key"]
    if differs:
        built = ", ".join(f"{k} {stored_key.get(k)!r}" for k in differs if isinstance(stored_key, dict))
        return f"built for another {'/'.join(differs)}: {built or stored_key!r}"
    for name, (size, digest) in sizes.items():
        problem = _file_problem(folder / name, size, digest)
        if problem is not None:
            return problem
    return None


def _file_problem(path: Path, size: int, digest: str) -> str | None:
    try:
        actual = path.stat().st_size
    except OSError:
        return f"its {path.name} is missing"
    if actual != size:
        return f"{path.name} is {actual} bytes, the manifest says {size}: truncated or replaced"
    if file_sha256(path) != digest:
        return f"{path.name} bytes differ from the manifest's sha256: corrupted"
    return None


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stale(path: Path) -> bool:
    """A build or save folder of a process that is gone; one named before the pid was in it
    (older rillet) once it is UNNAMED_BUILD_AGE_S old. Anything else is not ours: kept."""
    pid = _owner(path.name)
    if pid is not None:
        return not _alive(pid)
    if not path.name.startswith(BUILD_PREFIX):
        return False
    try:
        return time.time() - path.stat().st_mtime > UNNAMED_BUILD_AGE_S
    except OSError:  # gone meanwhile
        return False


def _owner(name: str) -> int | None:
    """The pid in the name of a build or save folder, else None (not one of ours: kept)."""
    if name.startswith(BUILD_PREFIX):
        field = name[len(BUILD_PREFIX) :].split("-")[0]
    elif name.endswith(SAVE_SUFFIX) and name.count(".") >= 4:
        field = name.split(".")[-3]
    else:
        return None
    return int(field) if field.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
