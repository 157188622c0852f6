"""Reading an image from a local file: only under `vision.allowed_local_path`, judged on the real
path (symlinks and `..` resolved), and once more on the file actually opened, so a symlink swapped
in between the check and the open cannot lead outside. Blocking: run it off the event loop."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rillet.core.vision.image import ImageError, ImageErrorKind
from rillet.http.vision.sources import too_large


def read_local(path: str, part: str, root: str | None, max_bytes: int) -> bytes:
    if root is None:
        msg = "local image files are not allowed (vision.allowed_local_path is not set)"
        raise ImageError(ImageErrorKind.FORBIDDEN, part, msg)
    base = Path(root).resolve()
    try:
        real = Path(path).resolve(strict=True)
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        if not _under(Path(os.path.abspath(path)), base):  # says nothing of files outside
            raise _outside(part) from e
        raise _missing(part) from e
    if not _under(real, base):
        raise _outside(part)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise _missing(part) from e
    try:
        opened = Path(f"/proc/self/fd/{fd}")
        if opened.exists() and not _under(opened.resolve(), base):
            raise _outside(part)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ImageError(ImageErrorKind.FETCH_FAILED, part, "the image path is not a regular file")
        if info.st_size > max_bytes:
            raise too_large(part, max_bytes)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise too_large(part, max_bytes)
    return data


def _under(path: Path, base: Path) -> bool:
    return path == base or path.is_relative_to(base)


def _outside(part: str) -> ImageError:
    msg = "the image path is outside the folder images may be read from (vision.allowed_local_path)"
    return ImageError(ImageErrorKind.FORBIDDEN, part, msg)


def _missing(part: str) -> ImageError:
    return ImageError(ImageErrorKind.FETCH_FAILED, part, "no readable image file at that path")
