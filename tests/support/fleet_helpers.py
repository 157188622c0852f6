"""`rillet fleet` as a subprocess for tests, and multi-turn conversations through a router: each
follow-up turn's cached_tokens against the prompt of the turn before it."""

from __future__ import annotations

import itertools
import random
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import openai
import requests
from repo import REPO

RILLET = Path(sys.executable).with_name("rillet")
BLOCK = 16  # cache.block_size: prefix hits are whole blocks


def free_port_block(n: int) -> int:
    """The first of `n` consecutive loopback ports that are free now."""
    for _ in range(200):
        base = random.randint(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of ports")


class FleetProcess:
    """`rillet fleet ...` with its output collected on threads; `url` once "fleet ready" shows."""

    def __init__(self, *args: str, log: Path) -> None:
        self.port = free_port_block(8)
        argv = [str(RILLET), "fleet", "--port", str(self.port), *args]
        self.log_file = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log_file, text=True, cwd=REPO)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def replica_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port + 1 + i}"

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any("fleet ready" in line for line in self.lines):
            assert self.proc.poll() is None, self.log
            assert time.monotonic() < deadline, self.log
            time.sleep(0.1)

    @property
    def log(self) -> str:
        self.log_file.flush()
        return "".join(self.lines) + Path(self.log_file.name).read_text()[-6000:]


def chat_requests_served(replica_url: str) -> float:
    """Chat completions a replica answered with 200, from its Prometheus counter."""
    text = requests.get(f"{replica_url}/metrics", timeout=10).text
    m = re.search(r'rillet_requests_total\{endpoint="/v1/chat/completions",status="200"\} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def metric(replica_url: str, name: str) -> float:
    text = requests.get(f"{replica_url}/metrics", timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} missing from {replica_url}/metrics"
    return float(m.group(1))


# One shared system prompt, then per conversation a long first message (a "document"): a new
# conversation shares less than the router's cache_threshold (0.3) with any other, so cache_aware
# places it on the replica with the smaller tree; its follow-ups share most of their text with the
# turn before and follow it.
SYSTEM = "You are the help desk of a hardware shop. Answer briefly, politely and only about the shop."


def document(conv: int, tag: str) -> str:
    words = " ".join(f"part{conv}-{i}" for i in range(40))
    return f"[{tag}] Conversation {conv}. My order holds these parts: {words}. Which of them ship first?"


@dataclass
class Turn:
    conv: int
    turn: int
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Conversations:
    turns: list[Turn] = field(default_factory=list)

    def follow_ups(self) -> list[tuple[Turn, Turn]]:
        """(turn before, follow-up) pairs."""
        by_conv: dict[int, list[Turn]] = {}
        for t in self.turns:
            by_conv.setdefault(t.conv, []).append(t)
        return [(a, b) for ts in by_conv.values() for a, b in itertools.pairwise(ts)]

    def history_hit_rate(self) -> float:
        """Follow-ups whose cached prefix covers the turn before's whole prompt (in whole blocks)."""
        pairs = self.follow_ups()
        hits = [b.cached_tokens >= a.prompt_tokens // BLOCK * BLOCK for a, b in pairs]
        return sum(hits) / len(hits)


def served_model(url: str) -> str:
    return str(requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"])


def converse(
    base_url: str, model: str, n_conv: int, n_turns: int, tag: str, max_tokens: int = 4
) -> Conversations:
    """`n_conv` conversations at once (a thread each), `n_turns` turns each, greedy."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=60)

    def one(conv: int) -> list[Turn]:
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        out = []
        for t in range(n_turns):
            text = document(conv, tag) if t == 0 else f"And what about part{conv}-{t}?"
            messages.append({"role": "user", "content": text})
            r = client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=max_tokens,
                temperature=0,  # type: ignore[arg-type]
            )
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            cached = r.usage.prompt_tokens_details.cached_tokens or 0
            out.append(Turn(conv, t, r.usage.prompt_tokens, cached))
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        return out

    with ThreadPoolExecutor(n_conv) as pool:
        return Conversations([t for ts in pool.map(one, range(n_conv)) for t in ts])
