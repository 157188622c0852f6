"""The startup banner: where to call the server, and the settings that shape its behaviour."""

from __future__ import annotations

import orjson
from rillet.core.config import RilletConfig


def base_url(host: str, port: int) -> str:
    """`http://host:port`, an IPv6 address in brackets (`http://[::1]:8000`; without them the
    printed URL was not one a client could use)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def ready_banner(
    cfg: RilletConfig, model_name: str, context: int, kv_blocks: int, host: str, port: int
) -> str:
    """`context`: the served context length; `kv_blocks`: the KV pool's usable blocks."""
    m, c, s, st, srv = cfg.model, cfg.cache, cfg.scheduler, cfg.stream, cfg.server
    url = base_url("127.0.0.1" if host in ("0.0.0.0", "::", "") else host, port)
    example = orjson.dumps(
        {"model": model_name, "messages": [{"role": "user", "content": "Hello!"}]}
    ).decode()
    auth = f"on ({len(srv.api_keys)} key{'s' * (len(srv.api_keys) != 1)})" if srv.api_keys else "off"
    key_header = " -H 'Authorization: Bearer <key>'" if srv.api_keys else ""
    lines = [
        f"ready: serving '{model_name}' at {url}/v1  (OpenAI API; /health, /metrics)",
        f"  model     path={m.path or '<default SmolLM2-135M-Instruct>'} kind={m.kind} dtype={m.dtype} "
        f"device={m.device} context={context}",
        f"  kv cache  {kv_blocks} blocks x {c.block_size} tokens, prefix caching "
        f"{'on' if c.prefix_caching else 'off'}",
        f"  scheduler max_num_seqs={s.max_num_seqs} max_num_batched_tokens={s.max_num_batched_tokens} "
        f"max_waiting={s.max_waiting}",
        f"  stream    max_tokens_per_event={st.max_tokens_per_event} max_delay_ms={st.max_delay_ms:g}",
        f"  server    listen={host}:{port} auth={auth} max_body={srv.max_body_bytes}B "
        f"max_tokens_cap={srv.max_tokens_cap} max_n={srv.max_n}",
        f"  try: curl {url}/v1/chat/completions -H 'Content-Type: application/json'{key_header} \\\n"
        f"         -d '{example}'",
    ]
    if srv.ui == "on":
        lines.insert(1, f"  browser   {url}/  (chat playground and live dashboard; server.ui: off hides it)")
    return "\n".join(lines)
