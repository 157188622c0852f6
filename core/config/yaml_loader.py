"""The YAML loader of config files and `--set` values: yaml.SafeLoader, except that a key given
twice in one mapping is an error (PyYAML keeps the last one silently, so a second `server:`
section appended to a file would drop every key of the first: its api_keys, authentication off),
and that `1e3` and `5e-1` are numbers, as in YAML 1.2 and JSON (YAML 1.1 wants a dot: `1.0e3`;
`--set server.request_timeout_s=1e3` was refused as "expected float, got '1e3'")."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode


class UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: later keys override it
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):  # SafeLoader's own error says so
                continue
            if key in seen:
                raise ConstructorError(
                    None, None, f"key {key!r} given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


# Appended after SafeLoader's resolvers: an int or a dotted float still resolves as before.
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
