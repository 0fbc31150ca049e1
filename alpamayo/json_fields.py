"""JSON config files: `read_json` reads one, `Fields` gives typed reads from one of its objects. Errors name
the file and the dotted field.

Used for `config.json` (model and Alpamayo planner sections) and `preprocessor_config.json`:

    f = Fields(read_json(path), "", str(path))
    hidden = f.sub("text_config").int("hidden_size")          # required
    eps = f.sub("text_config").number("rms_norm_eps", positive=True)
    bins = f.optional_sub("traj_tokenizer_cfg").int("num_bins", 3000, minimum=2)
"""

from __future__ import annotations

import json
import math
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
