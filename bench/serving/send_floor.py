"""What one streamed token's `send` costs the sender's CPU in this machine's kernel, with no server.

Issue 25 asks the event loop to spend at most 20 us more CPU per streamed token than per
non-streamed one. Part of what it spends is not Python: over loopback a `send` also runs the
receiving side's TCP path and wakes the client's process, in the sender's kernel time. This
measures that floor alone: this process, pinned to one core, sends one SSE chunk of a chat
completion (the bytes a streamed token puts on the wire) to a reader process pinned to another
core, then keeps its core busy for the gap (as the engine thread keeps the server's core busy
between tokens), and reads `time.thread_time()` (user + kernel CPU of this thread) around each
`send`. The reader blocks in `recv` between chunks, as a streaming client does: at a gap of a
decode step (~7 ms here) it is asleep when the chunk arrives, at a short gap it is still awake;
the difference is the cost of waking it (in a VM, an interrupt to another vCPU).

    .venv/bin/python -m bench.serving.send_floor                          # gaps 7, 2 and 0.2 ms
    .venv/bin/python -m bench.serving.send_floor --gaps-ms 20 7 --sends 1000
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from typing import Any

from bench.lib.common import peak_rss_mib, table, write_json

# one streamed token's event as the chat endpoint frames it (the size is what matters)
CHUNK = (
    b'data: {"id":"chatcmpl-5f0c1d2e3a4b","object":"chat.completion.chunk","created":1764720000,'
    b'"model":"SmolLM2-135M-Instruct","choices":[{"index":0,"delta":{"content":" river"},'
    b'"finish_reason":null}]}\n\n'
)


def _reader(port: int, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while s.recv(1 << 16):
            pass
    os._exit(0)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(gap_s: float, sends: int, sender_cpu: int, reader_cpu: int) -> dict[str, Any]:
    """us of this thread's CPU per send (median, mean, p90) with the reader on another core."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        pid = os.fork()
        if pid == 0:
            _reader(listener.getsockname()[1], reader_cpu)
        os.sched_setaffinity(0, {sender_cpu})
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cpu: list[float] = []
        for i in range(sends + 20):  # the first 20 warm the connection up
            t0 = time.thread_time()
            conn.sendall(CHUNK)
            if i >= 20:
                cpu.append((time.thread_time() - t0) * 1e6)
            _spin(gap_s)
        conn.close()
        os.waitpid(pid, 0)
    cpu.sort()
    return {
        "gap_ms": gap_s * 1e3,
        "send_cpu_us_median": round(statistics.median(cpu), 1),
        "send_cpu_us_mean": round(statistics.fmean(cpu), 1),
        "send_cpu_us_p90": round(cpu[int(0.9 * (len(cpu) - 1))], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gaps-ms", nargs="+", type=float, default=[7.0, 2.0, 0.2])
    ap.add_argument("--sends", type=int, default=400)
    ap.add_argument("--sender-cpu", type=int, default=0)
    ap.add_argument("--reader-cpu", type=int, default=1)
    ap.add_argument("--out", default="bench/out/send_floor.json")
    args = ap.parse_args()
    rows = [measure(g / 1e3, args.sends, args.sender_cpu, args.reader_cpu) for g in args.gaps_ms]
    rss = peak_rss_mib()
    print(f"{len(CHUNK)}-byte SSE chunk over loopback TCP, {args.sends} sends a gap; peak RSS {rss:.0f} MiB")
    print(table(rows, ["gap_ms", "send_cpu_us_median", "send_cpu_us_mean", "send_cpu_us_p90"]))
    write_json(args.out, {"args": vars(args), "chunk_bytes": len(CHUNK), "rows": rows, "peak_rss_mib": rss})


if __name__ == "__main__":
    main()
