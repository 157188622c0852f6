"""`vision`: image input for a vision-language model: how many images a request may carry, how big,
and where they may come from (data: URLs always; http(s) only from the listed hosts, never a
private address; local files only under one folder). A text-only model answers any image with a
400 whatever these say."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from rillet.core.config.errors import check

# A host name (labels of letters, digits and hyphens), optionally behind `*.` (its subdomains).
_HOST = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


@dataclass(frozen=True)
class VisionConfig:
    # Image parts one request may carry (all its messages together; a stored conversation continued
    # by previous_response_id counts its earlier images too).
    max_images: int = 8
    # Bytes one image may have once fetched, read or base64-decoded (a base64 image must also fit in
    # server.max_body_bytes).
    max_image_bytes: int = 20 * 1024 * 1024
    # Width x height an image may have, checked from its header before any pixel is decoded.
    max_pixels: int = 4096 * 4096
    # Hosts http(s) image URLs may name: `example.com` (that host), `*.example.com` (its
    # subdomains), `*` (any host). Empty (the default): no URL is fetched. Whatever the list, an
    # address that is private, loopback, link-local, multicast, reserved or unspecified is refused.
    allowed_domains: tuple[str, ...] = ()
    # Seconds one URL's fetch may take, redirects and body included.
    fetch_timeout_s: float = 10.0
    # A folder whose files (`file://` URLs, absolute paths) images may be read from; symlinks and
    # `..` are resolved first, so nothing outside it is reachable. null (the default): no files.
    allowed_local_path: str | None = None
    # The engine's side. Image tokens whose encoding may start in one step (a prefill chunk ends
    # before the image that would go over; the step's first image always goes).
    encoder_budget_tokens: int = 4096
    # MiB of image embeddings kept by the image's content hash: a repeated image is encoded once.
    encoder_cache_mb: int = 256

    def __post_init__(self) -> None:
        check(self.max_images >= 1, "vision.max_images", "must be >= 1")
        check(self.max_image_bytes >= 1024, "vision.max_image_bytes", "must be >= 1024")
        check(self.max_pixels >= 1, "vision.max_pixels", "must be >= 1")
        check(self.fetch_timeout_s > 0, "vision.fetch_timeout_s", "must be > 0")
        check(self.encoder_budget_tokens >= 1, "vision.encoder_budget_tokens", "must be >= 1")
        check(self.encoder_cache_mb >= 0, "vision.encoder_cache_mb", "must be >= 0")
        for entry in self.allowed_domains:
            check(
                _domain_ok(entry),
                "vision.allowed_domains",
                f"{entry!r} is not a host name, '*.' and a host name, '*' or an IP address",
            )
        path = self.allowed_local_path
        if path is not None:
            check(path.startswith("/"), "vision.allowed_local_path", "must be an absolute path")


def _domain_ok(entry: str) -> bool:
    if entry == "*" or _HOST.fullmatch(entry.lower()) is not None:
        return True
    try:
        ipaddress.ip_address(entry)
    except ValueError:
        return False
    return True
