"""The documentation holds together: every key of rillet.yaml is named on some page under docs/, and
every relative link of the README, docs/ and bench/'s Markdown (results, journal) resolves, anchors
included.

A key counts as named where its exact dotted name (`section.key`, or deeper for a nested section)
appears on a page, in backticks or not, not as part of a longer name. An anchor is checked
against the target's headings, slugged as GitHub does. Pure file reading: no model, no server."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rillet.core.config.root import RilletConfig
from rillet.core.config.yaml_loader import UniqueKeyLoader

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINKED_FILES = [
    ROOT / "README.md",
    *sorted(DOCS.glob("*.md")),
    *sorted((ROOT / "bench").glob("*.md")),  # RESULTS.md, README.md
    *sorted((ROOT / "bench").glob("*/*.md")),  # the journal, gpu/GPU.md, stress/README.md
]
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INDENTED_CODE = re.compile(r"(?:^(?: {4}|\t).*\n?)+", re.MULTILINE)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def _leaf_keys(cls: type, data: dict[str, Any], prefix: str) -> Iterator[str]:
    """The dotted keys under `data`, descending where the config dataclass has a nested section
    (a mapping that is one key's value, such as lora.adapters, stays one key)."""
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        key = f"{prefix}{name}"
        tp = hints.get(name)
        if isinstance(value, dict) and tp is not None and dataclasses.is_dataclass(tp):
            yield from _leaf_keys(typing.cast(type, tp), value, f"{key}.")
        else:
            yield key


def config_keys() -> list[str]:
    data = yaml.load((ROOT / "rillet.yaml").read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    return list(_leaf_keys(RilletConfig, data, ""))


def _prose(text: str) -> str:
    """The text a reader sees as prose: comments, fenced, indented and inline code left out."""
    text = HTML_COMMENT.sub("", text)
    text = FENCE.sub("", text)
    text = INDENTED_CODE.sub("", text)
    return INLINE_CODE.sub("", text)


def github_anchor(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = github_anchor(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(_prose(path.read_text(encoding="utf-8")))
        if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)  # http(s):, mailto: ...
    ]


def test_config_keys_are_read() -> None:
    keys = config_keys()
    assert "server.port" in keys and "lora.adapters" in keys
    assert len(keys) > 50


@pytest.mark.parametrize("key", config_keys())
def test_every_config_key_is_named_in_docs(key: str) -> None:
    named = re.compile(r"(?<![\w.])" + re.escape(key) + r"(?!\w)")
    pages = [p.name for p in sorted(DOCS.glob("*.md")) if named.search(p.read_text(encoding="utf-8"))]
    assert pages, f"config key {key!r} of rillet.yaml is named on no page under docs/"


@pytest.mark.parametrize("path", LINKED_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_docs_index_links_every_page() -> None:
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in relative_links(DOCS / "index.md")}
    pages = [p for p in sorted(DOCS.glob("*.md")) if p.name != "index.md"]
    missing = [p.name for p in pages if p.resolve() not in linked]
    assert not missing, f"docs/index.md does not link {missing}"


def test_readme_quick_start_is_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = INDENTED_CODE.search(section)
    assert block is not None
    commands = [line.split("#", 1)[0].strip() for line in block.group(0).splitlines() if line.strip()]
    assert commands == ["make serve", "make test"]


def test_anchor_slugs_follow_github() -> None:
    assert github_anchor("Speculative decoding and the new APIs on an H200 (issues 28, 34, 25)") == (
        "speculative-decoding-and-the-new-apis-on-an-h200-issues-28-34-25"
    )
    assert github_anchor("Offline throughput, rillet vs transformers `generate` (issue 2)") == (
        "offline-throughput-rillet-vs-transformers-generate-issue-2"
    )
    assert github_anchor("[2026-12-05](2026-12-05.md)") == "2026-12-05"
