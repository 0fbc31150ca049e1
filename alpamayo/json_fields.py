"""JSON config files: `read_json` reads one, `Fields` gives typed reads from one of its objects. Errors name
the file and the dotted field.

Used for `config.json` (model and Alpamayo planner sections) and `preprocessor_config.json`:

    f = Fields(read_json(path), "", str(path))
    hidden = f.sub("text_config").int("hidden_size")          # required
    eps = f.sub("text_config").number("rms_norm_eps", positive=True)
    bins = f.optional_sub("traj_tokenizer_cfg").int("num_bins", 3000, minimum=2)

and `build_dataclass` turns a YAML or JSON mapping into a frozen dataclass by its type hints (the node YAML,
`alpamayo.model_spec.ModelSpec`): unknown keys, missing keys and values of the wrong type are errors naming the
dotted key; `check` is the checks' one message form, "KEY = VALUE is invalid; allowed: RANGE".
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

from alpamayo.errors import ConfigError

REQUIRED: Any = object()  # default meaning "the field must be present"


def read_json(path: Path) -> Any:
    """The parsed content of a JSON config file; a ConfigError naming the file if unreadable or not JSON."""
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e})") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from e


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Fields:
    """One JSON object at dotted `path` of file `source`."""

    def __init__(self, data: Any, path: str, source: str):
        if not isinstance(data, dict):
            raise ConfigError(
                f"{source}: '{path or '<root>'}' must be a JSON object, got {type(data).__name__}"
            )
        self.data, self.path, self.source = data, path, source

    def name(self, key: str) -> str:
        """Dotted name of a field, e.g. 'vlm_config.text_config.hidden_size'."""
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def fail(self, key: str, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: field '{self.name(key)}' must be {what}, got {self.data[key]!r}")

    def missing(self, key: str) -> ConfigError:
        return ConfigError(f"{self.source}: missing field '{self.name(key)}'")

    def sub(self, key: str) -> Fields:
        """A required nested object."""
        if not self.has(key):
            raise self.missing(key)
        return Fields(self.data[key], self.name(key), self.source)

    def optional_sub(self, key: str) -> Fields:
        """A nested object that may be absent (then empty: every read takes its default)."""
        return Fields(self.data[key] if self.has(key) else {}, self.name(key), self.source)

    def _value(self, key: str, default: Any) -> Any:
        if self.has(key):
            return self.data[key]
        if default is REQUIRED:
            raise self.missing(key)
        return default

    def int(self, key: str, default: Any = REQUIRED, minimum: int = 1) -> int:
        value = self._value(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(
                f"{self.source}: field '{self.name(key)}' must be an integer >= {minimum}, got {value!r}"
            )
        return value

    def number(self, key: str, default: Any = REQUIRED, positive: bool = False) -> float:
        value = self._value(key, default)
        if not _is_number(value) or (positive and value <= 0):
            raise self.fail(key, "a positive finite number" if positive else "a finite number")
        return float(value)

    def numbers(
        self, key: str, default: Any = REQUIRED, length: int | None = None, positive: bool = False
    ) -> tuple[float, ...]:
        """A list of finite numbers (exactly `length`, else the default's length), all > 0 if `positive`."""
        value = self._value(key, default)
        length = length if length is not None else len(default)
        ok = (
            isinstance(value, (list, tuple))
            and len(value) == length
            and all(_is_number(v) and (v > 0 or not positive) for v in value)
        )
        if not ok:
            raise self.fail(key, f"a list of {length} {'positive ' if positive else ''}numbers (all finite)")
        return tuple(float(v) for v in value)

    def bool(self, key: str, default: Any = REQUIRED) -> bool:
        value = self._value(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false")
        return value

    def str(self, key: str, default: Any = REQUIRED) -> str:
        value = self._value(key, default)
        if not isinstance(value, str):
            raise self.fail(key, "a string")
        return value

    def int_list(self, key: str, default: Any = REQUIRED, minimum: int = 0) -> tuple[int, ...]:
        value = self._value(key, default)
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value
        )
        if not ok:
            raise self.fail(key, f"a list of integers >= {minimum}")
        return tuple(value)

    def optional_id(self, key: str) -> int | None:
        return self.int(key, minimum=0) if self.has(key) else None


def check(ok: bool, key: str, value: object, allowed: str) -> None:
    """ConfigError "KEY = VALUE is invalid; allowed: ALLOWED" unless `ok`."""
    if not ok:
        raise ConfigError(f"{key} = {value!r} is invalid; allowed: {allowed}")


def build_dataclass(cls: type, data: Any, path: str) -> Any:
    """`cls(**data)` with each value checked against `cls`'s type hints (nested dataclasses, lists, str-keyed
    dicts, unions, floats from ints); `path` prefixes every key an error names (e.g. "model.")."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(path + str(k) for k in unknown)}; allowed: {', '.join(names)}"
        )
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing key(s) {', '.join(path + k for k in missing)}")
    return cls(**{k: _coerce(hints[k], v, f"{path}{k}") for k, v in data.items()})


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) > 1:  # `float | str`: the type the value is spelled in
            inner = (
                [a for a in inner if a is str]
                if isinstance(value, str)
                else [a for a in inner if a is not str]
            )
        check(len(inner) == 1, key, value, " or ".join(a.__name__ for a in args if a is not type(None)))
        return _coerce(inner[0], value, key)
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, key + ".")
    if origin is list:
        check(isinstance(value, list), key, value, "a list")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        check(isinstance(value, dict) and all(isinstance(k, str) for k in value), key, value, "a mapping")
        return {k: _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        check(type(value) in (int, float), key, value, "a number")
        return float(value)
    check(type(value) is tp, key, value, f"a {tp.__name__}")
    return value
