"""A bad config value, named by its dotted key."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value. `key` is the dotted path (e.g. `cache.block_size`)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config key '{key}': {message}")
        self.key = key


def check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(key, message)
