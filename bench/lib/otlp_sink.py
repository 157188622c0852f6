"""A stand-in OpenTelemetry collector for benchmarks: an OTLP/HTTP traces endpoint on 127.0.0.1
that keeps the bodies it is sent and decodes them only when asked (GET /count: the spans so far),
so its own CPU during a measurement is one socket read per export batch.

    python -m bench.lib.otlp_sink PORT
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar


class _Handler(BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []  # one server per process: the class holds its state
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.lock:
            self.bodies.append(body)
        self._reply(b"", "application/x-protobuf")  # an empty ExportTraceServiceResponse: all taken

    def do_GET(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        with self.lock:
            bodies = list(self.bodies)
        spans = sum(
            len(scope.spans)
            for b in bodies
            for rs in ExportTraceServiceRequest.FromString(b).resource_spans
            for scope in rs.scope_spans
        )
        self._reply(json.dumps({"exports": len(bodies), "spans": spans}).encode(), "application/json")

    def _reply(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), _Handler).serve_forever()


if __name__ == "__main__":
    main()
