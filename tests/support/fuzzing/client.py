"""The HTTP client the fuzzers send hostile bodies through, one keep-alive connection to the
server, and the checks it applies to every answer: never a 5xx; every 4xx in the API's error shape
(OpenAI's, Anthropic's on /v1/messages); every 200 a well-formed answer (or an SSE stream that ends
as its API ends one, with no error event), by the checks of fuzzing/chat_checks.py and
fuzzing/api_checks.py. Shared by tests/reliability/test_fuzz_bodies.py and bench/stress/fuzz_bodies.py.
"""

from __future__ import annotations

import http.client
from collections import Counter

import orjson
from rel_helpers import CHAT, is_openai_error

from fuzzing.api_checks import (
    check_message,
    check_message_events,
    check_response,
    check_response_events,
    is_anthropic_error,
    named_events,
)
from fuzzing.chat_checks import check_completion, check_embeddings, check_sse
from fuzzing.tokenize_bodies import DETOKENIZE, TOKENIZE, check_tokenize_answer
from fuzzing.values import EMB, MESSAGES, RESPONSES


class Client:
    """One keep-alive connection to the server; reconnects when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn: http.client.HTTPConnection | None = None
        self.statuses: Counter[int] = Counter()
        self.cases = 0

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                headers = {k.lower(): v for k, v in r.getheaders()}
                if r.will_close:
                    self.close()
                return r.status, headers, data
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
                self.close()  # a keep-alive connection the server had closed: once more, fresh
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def check(self, path: str, body: bytes) -> None:
        """Sends one body; asserts the answer is a legal one."""
        answer = self._answer(path, body)
        if answer is None:
            return
        headers, data, context = answer
        if path in (RESPONSES, MESSAGES):
            self._check_api(path, headers, data, context)
        elif headers.get("content-type", "").startswith("text/event-stream"):
            check_sse(data, context)
        elif path == EMB:
            check_embeddings(orjson.loads(data), context)
        elif path in (TOKENIZE, DETOKENIZE):
            check_tokenize_answer(path, orjson.loads(data), context)
        else:
            check_completion(orjson.loads(data), path == CHAT, context)

    def _answer(self, path: str, body: bytes) -> tuple[dict[str, str], bytes, str] | None:
        """Sends one body and counts its status: never a 5xx, an error in its API's shape (then
        None); otherwise a 200's (headers, body, context for assertion messages)."""
        status, headers, data = self.post(path, body)
        self.cases += 1
        self.statuses[status] += 1
        context = f"{path} {body[:300]!r} -> {status} {data[:500]!r}"
        assert status < 500, context
        if status >= 400:
            assert headers.get("content-type", "").startswith("application/json"), context
            error = orjson.loads(data)
            assert (is_anthropic_error if path == MESSAGES else is_openai_error)(error), context
            return None
        assert status == 200, context
        return headers, data, context

    def _check_api(self, path: str, headers: dict[str, str], data: bytes, context: str) -> None:
        """/v1/responses and /v1/messages: answers in their APIs' shapes."""
        if headers.get("content-type", "").startswith("text/event-stream"):
            events = named_events(data, context)
            if path == RESPONSES:
                check_response_events(events, context)
            else:
                check_message_events(events, context)
        elif path == RESPONSES:
            check_response(orjson.loads(data), context)
        else:
            check_message(orjson.loads(data), context)
