"""Building a config from plain data (YAML, CLI overrides): every value checked against its
annotation, every unknown key refused, each error naming the dotted key."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from rillet.core.config.errors import ConfigError
from rillet.core.config.root import RilletConfig
from rillet.core.config.yaml_loader import UniqueKeyLoader


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping of names to {_type_name(get_args(tp)[1])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks `value` against the annotation `tp`; ints are accepted for floats, nothing else."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        given, choices = value, get_args(tp)
        if isinstance(value, bool) and ("on" in choices or "off" in choices):
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if value in choices:
            return value
        if isinstance(value, str):  # `debug` for DEBUG, as the --log-level flag takes it
            same = [c for c in choices if isinstance(c, str) and c.lower() == value.lower()]
            if len(same) == 1:
                return same[0]
        raise ConfigError(key, f"expected {_type_name(tp)}, got {given!r}")
    if origin is tuple:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
        return tuple(_coerce(v, get_args(tp)[0], key) for v in value)
    if origin is dict:  # {name: value}; each entry's errors name it (`lora.adapters.NAME`)
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
        k_tp, v_tp = get_args(tp)
        return {_coerce(k, k_tp, key): _coerce(v, v_tp, f"{key}.{k}") for k, v in value.items()}
    ok = {
        type(None): value is None,
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }
    if ok.get(tp, False):
        return _finite(value, key) if tp is float else value
    raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")


def _finite(value: int | float, key: str) -> float:
    """A float key's value: never inf or nan (every check below is a comparison, which both pass or
    fail in ways that break the server later), nor an int too large for a float."""
    try:
        number = float(value)
    except OverflowError:
        digits = len(str(value))
        raise ConfigError(key, f"expected a finite number, got an integer of {digits} digits") from None
    if not math.isfinite(number):
        raise ConfigError(key, f"expected a finite number, got {value!r}")
    return number


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(prefix or "<root>", f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        raise ConfigError(key, f"unknown key; allowed here: {', '.join(sorted(fields))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value if value is not None else {}, key)  # type: ignore[arg-type]
        else:
            kwargs[name] = _coerce(value, tp, key)
    return cls(**kwargs)


def _apply_override(data: dict[str, Any], assignment: str) -> None:
    """`a.b=value`; the value is parsed as YAML, so `16`, `true`, `null`, `[1, 2]` work."""
    if "=" not in assignment:
        raise ConfigError(assignment, "override must look like section.key=value")
    dotted, raw = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(dotted, "override key must be section.key (e.g. cache.block_size)")
    try:
        value = yaml.load(raw, Loader=UniqueKeyLoader) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(dotted, f"cannot parse value {raw!r}: {_yaml_error(exc)}") from exc
    section = data.get(parts[0])
    if section is None:  # absent, or a section left empty in the file (`model:`)
        section = data[parts[0]] = {}
    if not isinstance(section, dict):
        raise ConfigError(parts[0], "expected a mapping")
    section[parts[1]] = value


def config_from_dict(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> RilletConfig:
    if not isinstance(data, dict):  # a file whose top level is a list or a scalar
        raise ConfigError("<root>", f"expected a mapping of sections, got {data!r}")
    merged: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for assignment in overrides:
        _apply_override(merged, assignment)
    cfg: RilletConfig = _build(RilletConfig, merged, "")
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RilletConfig:
    data: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError("--config", f"{path} is not UTF-8 text (byte {exc.start})") from exc
        try:
            data = yaml.load(text, Loader=UniqueKeyLoader) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("--config", f"{path} is not valid YAML: {_yaml_error(exc)}") from exc
    return config_from_dict(data, overrides)


def _yaml_error(exc: yaml.YAMLError) -> str:
    """pyyaml's message on one line: what went wrong and where (it quotes the line with a caret)."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def config_to_dict(cfg: RilletConfig) -> dict[str, Any]:
    def plain(v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    return {
        f.name: {k: plain(v) for k, v in dataclasses.asdict(getattr(cfg, f.name)).items()}
        for f in dataclasses.fields(cfg)
    }
