"""One build of a C++ extension at a time across processes, with no lock that outlives its owner.

torch's extension builder (`cpp_extension.load`) guards a build folder with a `lock` file it
creates exclusively and removes when done; every other process polls until the file is gone. A
process killed mid-build (a server stopped with Ctrl-C during its first start) leaves the file
behind, and the next start waits on it forever, silently. The file holds no owner to check.

So rillet's builds first take an `flock` on a file beside it (`rillet.flock`). The kernel drops an
flock when its process dies, however it dies. Whoever holds the flock is the only rillet process
that can be building; a torch `lock` it finds was left by a build that did not finish, and is
removed. A process that finds the flock held waits for the build in progress (it finishes, ~25 s,
or its process dies), saying so in the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

GUARD = "rillet.flock"
TORCH_LOCK = "lock"  # torch.utils.cpp_extension's FileBaton in the build folder


def load_extension(name: str, source: Path, cflags: Sequence[str] = ()) -> str | None:
    """Builds (torch caches it under TORCH_EXTENSIONS_DIR) and loads rillet's C++ extension `name`
    from `source`, one build at a time across processes, with OpenMP (at::parallel_for is OpenMP
    pragmas in ATen's headers: serial without). None when loaded, else why not (no compiler, no
    ninja, a failed build)."""
    try:
        from torch.utils import cpp_extension

        # torch's own lock may be one a killed build left: exclusive_build tells which
        with exclusive_build(Path(cpp_extension._get_build_directory(name, verbose=False))):
            cpp_extension.load(
                name,
                [str(source)],
                extra_cflags=["-O3", "-fopenmp", *cflags],
                extra_ldflags=["-fopenmp"],
                is_python_module=False,
                verbose=False,
            )
    except (OSError, RuntimeError, ImportError) as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def exclusive_build(build_dir: Path) -> Iterator[None]:
    """Holds the build folder's flock for the body; any torch lock found on entry is removed."""
    build_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(build_dir / GUARD, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process's build in %s (it holds %s)", build_dir, GUARD)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _drop_left_lock(build_dir / TORCH_LOCK)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def _drop_left_lock(lock: Path) -> None:
    try:
        lock.unlink()
    except FileNotFoundError:
        return  # the common case: the last build finished
    log.warning("removed %s, left by a build that did not finish", lock)
