"""The pieces of image loading that need no server: data: URLs and base64 (sources.py), the URL
kinds taken, `vision.allowed_domains` matching and the public-address rule (guard.py), files
under `vision.allowed_local_path` (local.py: `..`, symlinks out, missing files), and the
`vision.*` keys' validation. Every refusal is an ImageError of the kind the API's 400 reports."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest
from http_doubles.images import b64, image_bytes
from rillet.core.config import ConfigError, load_config
from rillet.core.vision.image import ImageError, ImageErrorKind
from rillet.http.vision.guard import host_allowed, is_public
from rillet.http.vision.local import read_local
from rillet.http.vision.sources import ImageSource, data_url_source, decode_base64, url_source

PART = "messages[0].content[1]"
K = ImageErrorKind


def kind_of(fn: object, *args: object) -> ImageErrorKind:
    with pytest.raises(ImageError) as err:
        fn(*args)  # type: ignore[operator]
    assert err.value.part == PART
    return err.value.kind


def test_data_urls() -> None:
    png = image_bytes()
    assert data_url_source(f"data:image/png;base64,{b64(png)}", PART) == ImageSource(PART, "base64", b64(png))
    assert data_url_source(f"data:;base64,{b64(png)}", PART).kind == "base64"  # no type: Pillow decides
    assert data_url_source(f"DATA:Image/PNG;charset=x;BASE64,{b64(png)}", PART).kind == "base64"
    assert kind_of(data_url_source, "data:image/png,rawbytes", PART) is K.NOT_BASE64  # percent-encoded
    assert kind_of(data_url_source, "data:image/png;base64", PART) is K.NOT_BASE64  # no comma
    assert kind_of(data_url_source, f"data:text/plain;base64,{b64(png)}", PART) is K.NOT_AN_IMAGE


def test_base64_payloads() -> None:
    png = image_bytes()
    text = b64(png)
    assert decode_base64(text, PART, 10_000) == png
    wrapped = "\n".join(text[i : i + 20] for i in range(0, len(text), 20))  # MIME-style lines
    assert decode_base64(wrapped, PART, 10_000) == png
    assert decode_base64(text.rstrip("="), PART, 10_000) == png  # padding left off
    assert kind_of(decode_base64, "not base64 at all!", PART, 10_000) is K.NOT_BASE64
    assert kind_of(decode_base64, "iVBORw0K\u00e9", PART, 10_000) is K.NOT_BASE64  # not ASCII
    assert kind_of(decode_base64, "", PART, 10_000) is K.NOT_AN_IMAGE
    assert kind_of(decode_base64, b64(bytes(5000)), PART, 4096) is K.TOO_LARGE  # refused before decoding
    assert kind_of(decode_base64, b64(bytes(4097)), PART, 4096) is K.TOO_LARGE  # by one byte


def test_url_kinds() -> None:
    assert url_source("https://example.com/a.png", PART) == ImageSource(
        PART, "http", "https://example.com/a.png"
    )
    assert url_source("HTTP://example.com/a.png", PART).kind == "http"
    spaced = ImageSource(PART, "path", "/srv/my images/a.png")
    assert url_source("file:///srv/my%20images/a.png", PART) == spaced
    assert url_source("file://localhost/srv/a.png", PART).value == "/srv/a.png"
    assert url_source("/srv/a.png", PART) == ImageSource(PART, "path", "/srv/a.png")
    for refused in (
        "file://otherhost/srv/a.png",
        "ftp://example.com/a.png",
        "a.png",
        "../a.png",
        "gopher://x",
    ):
        assert kind_of(url_source, refused, PART) is K.FORBIDDEN, refused


def test_allowed_domains() -> None:
    patterns = ("example.com", "*.images.org")
    assert host_allowed("example.com", patterns)
    assert host_allowed("example.com.", patterns)  # the root's dot
    assert not host_allowed("www.example.com", patterns)  # exact: not its subdomains
    assert not host_allowed("badexample.com", patterns)
    assert host_allowed("cdn.images.org", patterns) and host_allowed("a.b.images.org", patterns)
    assert not host_allowed("images.org", patterns)  # `*.` is the subdomains, not the domain
    assert not host_allowed("evilimages.org", patterns)
    assert host_allowed("anything.net", ("*",))
    assert not host_allowed("example.com", ())
    assert host_allowed("example.com", ("EXAMPLE.com",))


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),  # loopback
        ("127.8.9.10", False),
        ("::1", False),
        ("10.1.2.3", False),  # private
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("fc00::1", False),  # unique local
        ("169.254.169.254", False),  # link-local: cloud metadata
        ("fe80::1", False),
        ("224.0.0.1", False),  # multicast
        ("ff02::1", False),
        ("0.0.0.0", False),  # unspecified
        ("::", False),
        ("240.0.0.1", False),  # reserved
        ("100.64.0.1", False),  # shared address space (carrier NAT)
        ("192.0.2.1", False),  # documentation
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:169.254.169.254", False),
        ("2002:7f00:1::", False),  # 6to4 around 127.0.0.1
        ("2002:a9fe:a9fe::", False),  # 6to4 around 169.254.169.254
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 around 169.254.169.254
    ],
)
def test_public_addresses_only(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public


def test_local_files_only_under_the_folder(tmp_path: Path) -> None:
    root = tmp_path / "images"
    (root / "sub").mkdir(parents=True)
    png = image_bytes()
    (root / "sub" / "a.png").write_bytes(png)
    (tmp_path / "secret.png").write_bytes(png)
    (root / "out.png").symlink_to(tmp_path / "secret.png")  # a link leading outside
    (root / "in.png").symlink_to(root / "sub" / "a.png")  # a link staying inside
    r = str(root)
    assert read_local(f"{r}/sub/a.png", PART, r, 10_000) == png
    assert read_local(f"{r}/in.png", PART, r, 10_000) == png
    assert read_local(f"{r}/sub/../sub/a.png", PART, r, 10_000) == png
    assert kind_of(read_local, f"{r}/sub/a.png", PART, None, 10_000) is K.FORBIDDEN  # no folder set
    assert kind_of(read_local, f"{r}/../secret.png", PART, r, 10_000) is K.FORBIDDEN  # `..` out
    assert kind_of(read_local, f"{r}/out.png", PART, r, 10_000) is K.FORBIDDEN  # symlink out
    assert kind_of(read_local, "/etc/passwd", PART, r, 10_000) is K.FORBIDDEN
    assert kind_of(read_local, f"{r}/../nothing.png", PART, r, 10_000) is K.FORBIDDEN  # outside, missing
    assert kind_of(read_local, f"{r}/nothing.png", PART, r, 10_000) is K.FETCH_FAILED  # inside, missing
    assert kind_of(read_local, f"{r}/sub", PART, r, 10_000) is K.FETCH_FAILED  # a folder
    assert kind_of(read_local, f"{r}/sub/a.png", PART, r, len(png) - 1) is K.TOO_LARGE


def test_the_folder_may_itself_be_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.png").write_bytes(image_bytes())
    os.symlink(real, tmp_path / "link")
    assert read_local(str(tmp_path / "link" / "a.png"), PART, str(tmp_path / "link"), 10_000)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("vision.max_images=0", "vision.max_images"),
        ("vision.max_image_bytes=10", "vision.max_image_bytes"),
        ("vision.max_pixels=0", "vision.max_pixels"),
        ("vision.fetch_timeout_s=0", "vision.fetch_timeout_s"),
        ('vision.allowed_domains=["https://example.com"]', "vision.allowed_domains"),
        ('vision.allowed_domains=["example.com/images"]', "vision.allowed_domains"),
        ('vision.allowed_domains=["*example.com"]', "vision.allowed_domains"),
        ("vision.allowed_local_path=images", "vision.allowed_local_path"),
        ("vision.max_imgs=3", "vision.max_imgs"),
    ],
)
def test_bad_vision_keys_name_themselves(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.key == key


def test_vision_defaults_fetch_nothing() -> None:
    listed = 'vision.allowed_domains=["example.com", "*.cdn.net", "*", "203.0.113.9"]'
    cfg = load_config(None, [listed]).vision
    assert cfg.allowed_domains == ("example.com", "*.cdn.net", "*", "203.0.113.9")
    default = load_config(None, []).vision
    assert default.allowed_domains == () and default.allowed_local_path is None
