"""A cross-thread wake-up the event loop waits on with `add_reader`: an eventfd (Linux), else a pipe.

The engine thread calls `wake()` (one syscall, no Python object made, nothing scheduled on the
loop); the loop runs its reader callback, which calls `clear()` first. Several wakes before the
callback runs are one callback: the eventfd's counter (or the pipe's bytes) are read at once.
"""

from __future__ import annotations

import contextlib
import os


class Waker:
    __slots__ = ("_eventfd", "_r", "_w")

    def __init__(self) -> None:
        make = getattr(os, "eventfd", None)
        if make is not None:
            fd = make(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._eventfd, self._r, self._w = True, fd, fd
        else:  # not Linux: a non-blocking pipe
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)
            self._eventfd = False

    def fileno(self) -> int:
        return self._r

    def wake(self) -> None:
        """Any thread. Never blocks: a full pipe already holds a wake-up."""
        with contextlib.suppress(BlockingIOError):
            if self._eventfd:
                os.eventfd_write(self._w, 1)
            else:
                os.write(self._w, b"\0")

    def clear(self) -> None:
        """The loop, at the top of its callback: forget every wake so far."""
        with contextlib.suppress(BlockingIOError):
            if self._eventfd:
                os.eventfd_read(self._r)
            else:
                while os.read(self._r, 4096):
                    pass

    def close(self) -> None:
        os.close(self._r)
        if self._w != self._r:
            os.close(self._w)
