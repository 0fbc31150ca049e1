"""Precision recipes of the ttnn backend: a dtype per tensor group and a math fidelity per op group.

A recipe is data (tt-metal `DecodersPrecision` style), validated on construction:

    name: my-recipe
    base: performance          # optional: start from a preset, then override
    dtypes:   {qkv: bfp8, o: bfp8, mlp_gate_up: bfp4, mlp_down: bfp4, experts: bfp4, lm_head: bfp8,
               vision: bfp8, expert: bfp8, kv_cache: bfp8}
    fidelity: {qkv: hifi2, o: hifi2, mlp_gate_up: lofi, mlp_down: lofi, experts: hifi2, router: hifi4,
               lm_head: hifi2, vision: hifi2, expert: hifi2, sdpa: hifi4, norm: hifi4}

Tensor groups: the text attention (`qkv`, `o`), the dense MLP (`mlp_gate_up`, `mlp_down`), the routed MoE
experts (`experts`: gate, up and down of every expert), the `lm_head`, every linear weight of the vision tower
(`vision`: patch embedding, block and merger projections), every linear weight of the flow-matching action
expert (`expert`: its decoder layers' projections, the in-projection MLP and `action_out_proj`; not to be
confused with the MoE `experts`) and the `kv_cache`. Norm weights, biases and the MoE
router stay bf16 in every recipe (`alpamayo.plan.weights.BF16_GROUPS`). Op groups add the MoE `router` (fp32
logits: a bf16 logit rounding can flip a near-tie expert choice), the prefill-style `vision` matmuls and the
action expert's matmuls (`expert`).

Presets:
  * `accuracy`: bfp8 weights everywhere, bf16 KV cache, HiFi4 math throughout.
  * `performance`: bfp4 MLP and experts, bfp8 attention, lm_head and vision tower, bfp8 KV cache; LoFi for the
    dense bfp4 matmuls and HiFi2 for the bfp8 ones (fidelity matched to the weight mantissa: bfp4 keeps 3
    bits, which one LoFi pass covers; bfp8 keeps 7, which HiFi2 covers). The experts get HiFi2 although they
    are bfp4: tt-metal's single-chip MoE measured LoFi sparse matmuls capping an MoE layer near PCC 0.98
    (HiFi4 recovered >= 0.99); decode reads only k experts' weights, so the extra pass is not the bottleneck.
    The action expert stays bfp8 with HiFi2: its output is a regression (velocities integrated over 10 Euler
    steps into waypoints), with no argmax to absorb the error, and a bfp4 weight alone already costs PCC
    0.9932 per matmul (tests/test_tt_weights.py) against the 0.99 per-step velocity bound, over 7 matmuls
    x 36 layers. Recipes may still choose bfp4 (`alpamayo precision` measures what it costs).
    Qwen3-VL-32B in this recipe is ~21 GB of text weights, the configuration tt-metal runs Qwen3-VL-32B in
    (../shared/reference/ttmetal.md §3); Qwen3-VL-30B-A3B is 18.4 GB with its vision tower, 16.3 GB of it experts.

Block-float sizes per 32x32 tile (`alpamayo.plan.block_float`, equal to ttnn 0.81.1's `.tensorbin` payloads):
bf16 2048 bytes; bfp8 1088 (1024 mantissa bytes + 64 shared exponents, one per 16 values); bfp4 576.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alpamayo.errors import ConfigError
from alpamayo.plan.block_float import FORMATS

DTYPES = ("bf16", "bfp8", "bfp4")
KV_CACHE_DTYPES = ("bf16", "bfp8")  # paged_update_cache repacks into these; bfp4 K/V is not supported
TENSOR_GROUPS = (
    "qkv",
    "o",
    "mlp_gate_up",
    "mlp_down",
    "experts",
    "lm_head",
    "vision",
    "expert",
    "kv_cache",
)
FIDELITIES = ("lofi", "hifi2", "hifi3", "hifi4")
OP_GROUPS = (
    "qkv",
    "o",
    "mlp_gate_up",
    "mlp_down",
    "experts",
    "router",
    "lm_head",
    "vision",
    "expert",
    "sdpa",
    "norm",
)
TILE_BYTES = {"bf16": 2048, **{name: f.tile_bytes for name, f in FORMATS.items()}}
# Largest error of one element after block-float packing, as a fraction of the largest magnitude in its
# 16-value block: half a step of the shared scale, 2^-W (measured with ttnn 0.81.1's host packer on
# heavy-tailed data: bfp8 2^-7, bfp4 2^-3).
BLOCK_FLOAT_ERROR = {"bf16": 0.0, **{name: 2.0**-f.mantissa_bits for name, f in FORMATS.items()}}


@dataclass(frozen=True)
class Precision:
    """dtypes: tensor group -> bf16|bfp8|bfp4; fidelity: op group -> lofi|hifi2|hifi3|hifi4."""

    name: str
    dtypes: Mapping[str, str] = field(default_factory=dict)
    fidelity: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_table(self.name, "dtypes", self.dtypes, TENSOR_GROUPS, DTYPES)
        _check_table(self.name, "fidelity", self.fidelity, OP_GROUPS, FIDELITIES)
        if self.dtypes["kv_cache"] not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"recipe {self.name!r}: dtypes.kv_cache = {self.dtypes['kv_cache']!r}; "
                f"allowed: {', '.join(KV_CACHE_DTYPES)}"
            )

    def dtype(self, group: str) -> str:
        return self.dtypes[group]

    def math_fidelity(self, op: str) -> str:
        return self.fidelity[op]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtypes": dict(self.dtypes), "fidelity": dict(self.fidelity)}

    @classmethod
    def from_dict(cls, data: Any, source: str) -> Precision:
        """Parse a recipe object (see module docstring); `source` names the file in errors."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a precision recipe must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {"name", "base", "dtypes", "fidelity"})
        if unknown:
            raise ConfigError(f"{source}: unknown field(s) {unknown}; allowed: name, base, dtypes, fidelity")
        base_name = data.get("base")
        if base_name is not None and base_name not in PRESETS:
            raise ConfigError(f"{source}: base = {base_name!r}; allowed: {', '.join(PRESETS)}")
        base = PRESETS[base_name] if base_name else None
        tables = {}
        for key in ("dtypes", "fidelity"):
            table = data.get(key, {})
            if not isinstance(table, dict):
                raise ConfigError(f"{source}: '{key}' must be a mapping, got {table!r}")
            tables[key] = {**(dict(getattr(base, key)) if base else {}), **table}
        return cls(name=str(data.get("name", source)), **tables)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Precision:
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as e:
            raise ConfigError(f"{path}: cannot read precision recipe ({e})") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e})") from e
        return cls.from_dict(data, str(path))


def _check_table(
    name: str, what: str, table: Mapping[str, str], keys: tuple[str, ...], values: tuple[str, ...]
) -> None:
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise ConfigError(f"recipe {name!r}: unknown {what} group(s) {unknown}; allowed: {', '.join(keys)}")
    missing = [k for k in keys if k not in table]
    if missing:
        raise ConfigError(f"recipe {name!r}: {what} has no entry for {missing} (and no 'base' preset)")
    for key in keys:
        if table[key] not in values:
            raise ConfigError(f"recipe {name!r}: {what}.{key} = {table[key]!r}; allowed: {', '.join(values)}")


PRESETS: dict[str, Precision] = {
    "accuracy": Precision(
        name="accuracy",
        dtypes={**dict.fromkeys(TENSOR_GROUPS, "bfp8"), "kv_cache": "bf16"},
        fidelity=dict.fromkeys(OP_GROUPS, "hifi4"),
    ),
    "performance": Precision(
        name="performance",
        dtypes={
            "qkv": "bfp8",
            "o": "bfp8",
            "mlp_gate_up": "bfp4",
            "mlp_down": "bfp4",
            "experts": "bfp4",
            "lm_head": "bfp8",
            "vision": "bfp8",
            "expert": "bfp8",
            "kv_cache": "bfp8",
        },
        fidelity={
            "qkv": "hifi2",
            "o": "hifi2",
            "mlp_gate_up": "lofi",
            "mlp_down": "lofi",
            "experts": "hifi2",
            "router": "hifi4",
            "lm_head": "hifi2",
            "vision": "hifi2",
            "expert": "hifi2",
            "sdpa": "hifi4",
            "norm": "hifi4",
        },
    ),
}


def load_precision(spec: str | Precision) -> Precision:
    """A preset name (`accuracy`, `performance`), a YAML file path, or an existing `Precision`."""
    if isinstance(spec, Precision):
        return spec
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return Precision.from_yaml(path)
    raise ConfigError(f"--recipe {spec!r}: not a preset ({', '.join(PRESETS)}) and not a YAML file")
