"""The MoE settings, in one place: what a checkpoint says and how its blocks are laid out.

`MoEConfig` is a Qwen3-VL-MoE checkpoint's sparse-MLP settings, read from its text config (`parse_moe`): expert
count, top-k, expert width and which layers are sparse. `MoEBlockConfig` is the validated shape and placement of
one MoE decode block (dispatch -> compute -> combine), derived from it (`MoEBlockConfig.for_text`) or read from a
YAML file (`alpamayo.config.builtin.block_config_for` picks the one a model runs with).

The same block config drives the torch reference (`alpamayo.text.moe.block.MoEBlock`) and the ttnn MoE block, so
it names only device-neutral things, after tt-metal's `TTMoEDecodeConfig`:

    hidden_size: 2048
    intermediate_size: 768            # per-expert SwiGLU width
    num_routed_experts: 128
    select_experts_k: 8               # routed experts per token
    num_slots: 1                      # devices (or core groups) the routed experts are split over
    mesh_shape: [1, 1]                # how those devices are arranged (rows, columns); rows x cols = slots
    expert_mapping: sequential        # or a list: the slot of each routed expert
    num_shared_experts: 0             # experts every token visits, ids right after the routed ones
    shared_expert_ids_to_slots: fully_replicated   # or {shared id: [slots holding a replica]}
    shared_expert_scale: 1.0          # fixed combine weight of every shared expert
    has_bias: false                   # per-expert biases on gate, up and down

Validation fails fast, naming the field, the value and the allowed range: the routed count must divide evenly
over the slots (the hardware shards the expert dim evenly), the mesh must hold exactly the slots, every mapping
entry must name a slot, each slot must hold the same number of routed experts, shared-expert ids must be
exactly `num_routed_experts .. num_routed_experts + num_shared_experts - 1`, and per-expert biases cannot be
combined with shared experts (the hardware block has no bias rows for them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, cast

import yaml

from alpamayo.errors import ConfigError
from alpamayo.json_fields import Fields

SEQUENTIAL = "sequential"
FULLY_REPLICATED = "fully_replicated"


@dataclass(frozen=True)
class MoEConfig:
    """Sparse-MLP settings of a Qwen3-VL-MoE text model."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_sparse(self, layer: int) -> bool:
        """Layer `layer` uses the MoE block (transformers' rule); otherwise a dense SwiGLU MLP."""
        return (
            layer not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer + 1) % self.decoder_sparse_step == 0
        )


def parse_moe(text: Fields, n_layers: int) -> MoEConfig:
    """The `MoEConfig` of an MoE model's HF-style text config `text` with `n_layers` decoder layers."""
    key = "num_experts" if text.has("num_experts") else "num_local_experts"
    if not text.has(key):
        raise ConfigError(
            f"{text.source}: missing field '{text.name('num_experts')}' (or 'num_local_experts')"
        )
    moe = MoEConfig(
        num_experts=text.int(key),
        num_experts_per_tok=text.int("num_experts_per_tok"),
        moe_intermediate_size=text.int("moe_intermediate_size"),
        decoder_sparse_step=text.int("decoder_sparse_step", 1),
        mlp_only_layers=text.int_list("mlp_only_layers", ()),
    )
    if moe.num_experts_per_tok > moe.num_experts:
        raise ConfigError(
            f"{text.source}: '{text.name('num_experts_per_tok')}' = {moe.num_experts_per_tok} exceeds "
            f"the number of experts {moe.num_experts}"
        )
    bad = [i for i in moe.mlp_only_layers if i >= n_layers]
    if bad:
        raise ConfigError(
            f"{text.source}: '{text.name('mlp_only_layers')}' names layers {bad} >= num_hidden_layers {n_layers}"
        )
    return moe


class MoEText(Protocol):
    """What a block config reads of a text config (`alpamayo.config.model.TextConfig`, which holds its
    `MoEConfig`)."""

    @property
    def hidden_size(self) -> int: ...

    @property
    def moe(self) -> MoEConfig | None: ...


@dataclass(frozen=True)
class MoEBlockConfig:
    """Dimensions and expert placement of one MoE block; see the module docstring for the YAML form.

    `expert_mapping=None` means sequential (slot s holds experts s*E/slots .. (s+1)*E/slots - 1);
    `shared_expert_ids_to_slots=None` means every shared expert is replicated on every slot;
    `mesh_shape=None` means one row of `num_slots` devices. All are resolved to explicit values on
    construction. (`alpamayo.tt.moe` runs the block on one chip: mesh [1, 1].)
    """

    hidden_size: int
    intermediate_size: int
    num_routed_experts: int
    select_experts_k: int
    num_slots: int = 1
    mesh_shape: tuple[int, int] | None = None
    expert_mapping: tuple[int, ...] | None = None
    num_shared_experts: int = 0
    shared_expert_ids_to_slots: Mapping[int, tuple[int, ...]] | None = None
    shared_expert_scale: float = 1.0
    has_bias: bool = False

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_routed_experts",
            "select_experts_k",
            "num_slots",
        ):
            _check_int(name, getattr(self, name), 1)
        _check_int("num_shared_experts", self.num_shared_experts, 0)
        e, k, slots = self.num_routed_experts, self.select_experts_k, self.num_slots
        if k > e:
            raise ConfigError(f"select_experts_k = {k} must be in [1, num_routed_experts = {e}]")
        if e % slots:
            raise ConfigError(
                f"num_routed_experts = {e} is not divisible by num_slots = {slots}: every slot must hold "
                f"the same number of routed experts"
            )
        if self.expert_mapping is None:
            mapping = tuple(i // (e // slots) for i in range(e))
        else:
            mapping = tuple(self.expert_mapping)
        object.__setattr__(self, "expert_mapping", mapping)
        object.__setattr__(self, "mesh_shape", self._resolve_mesh())
        self._check_mapping(mapping)
        object.__setattr__(self, "shared_expert_ids_to_slots", self._resolve_shared())
        scale = self.shared_expert_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ConfigError(f"shared_expert_scale must be a finite number, got {scale!r}")
        if not isinstance(self.has_bias, bool):
            raise ConfigError(f"has_bias must be true or false, got {self.has_bias!r}")
        if self.has_bias and self.num_shared_experts:
            raise ConfigError(
                f"has_bias = true cannot be combined with num_shared_experts = {self.num_shared_experts}: "
                f"shared experts carry no bias rows in the MoE block"
            )

    def _resolve_mesh(self) -> tuple[int, int]:
        if self.mesh_shape is None:
            return (1, self.num_slots)
        mesh = self.mesh_shape
        if (
            not isinstance(mesh, Sequence)
            or isinstance(mesh, str)
            or len(mesh) != 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in mesh)
        ):
            raise ConfigError(f"mesh_shape must be [rows, columns], two integers >= 1, got {mesh!r}")
        if mesh[0] * mesh[1] != self.num_slots:
            raise ConfigError(
                f"mesh_shape {list(mesh)} holds {mesh[0] * mesh[1]} devices but num_slots = {self.num_slots}: "
                f"the routed experts are split over every device of the mesh"
            )
        return (mesh[0], mesh[1])

    def _check_mapping(self, mapping: tuple[int, ...]) -> None:
        e, slots = self.num_routed_experts, self.num_slots
        if len(mapping) != e:
            raise ConfigError(
                f"expert_mapping has {len(mapping)} entries, expected one slot per routed expert ({e})"
            )
        bad = [(i, s) for i, s in enumerate(mapping) if not _is_slot(s, slots)]
        if bad:
            shown = ", ".join(f"expert_mapping[{i}] = {s!r}" for i, s in bad[:5])
            raise ConfigError(f"{shown} out of range: slots are integers in [0, num_slots = {slots})")
        per_slot = [mapping.count(s) for s in range(slots)]
        if len(set(per_slot)) != 1:
            raise ConfigError(
                f"expert_mapping puts {per_slot} routed experts on slots 0..{slots - 1}; each slot must hold "
                f"num_routed_experts / num_slots = {e // slots}"
            )

    def _resolve_shared(self) -> dict[int, tuple[int, ...]]:
        e, n, slots = self.num_routed_experts, self.num_shared_experts, self.num_slots
        given = self.shared_expert_ids_to_slots
        if n == 0:
            if given:
                raise ConfigError(
                    f"num_shared_experts = 0 but shared_expert_ids_to_slots names experts {sorted(given)}"
                )
            return {}
        if given is None:
            return {sid: tuple(range(slots)) for sid in range(e, e + n)}
        expected = list(range(e, e + n))
        if sorted(given) != expected:
            raise ConfigError(
                f"shared expert ids must be contiguous after the {e} routed ones: expected {expected}, "
                f"got {sorted(given)}"
            )
        resolved = {}
        for sid in expected:
            held = tuple(given[sid])
            if not held or not all(_is_slot(s, slots) for s in held):
                raise ConfigError(
                    f"shared_expert_ids_to_slots[{sid}] = {list(held)} must be a non-empty list of slots in "
                    f"[0, num_slots = {slots})"
                )
            resolved[sid] = held
        per_slot = [sum(s in held for held in resolved.values()) for s in range(slots)]
        if len(set(per_slot)) != 1 or per_slot[0] == 0:
            raise ConfigError(
                f"shared_expert_ids_to_slots gives slots 0..{slots - 1} {per_slot} shared experts; every slot "
                f"must hold the same number, at least 1"
            )
        return resolved

    # ------------------------------------------------------------------ derived values
    @property
    def experts_per_slot(self) -> int:
        return self.num_routed_experts // self.num_slots

    @property
    def effective_k(self) -> int:
        """Experts each token visits: its top-k routed experts, then every shared expert."""
        return self.select_experts_k + self.num_shared_experts

    @property
    def storage_order(self) -> tuple[int, ...]:
        """Routed expert ids in slot-major storage order (stable: ascending ids within a slot)."""
        mapping = cast(tuple[int, ...], self.expert_mapping)  # resolved on construction, never None
        return tuple(sorted(range(self.num_routed_experts), key=lambda i: mapping[i]))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def for_text(cls, cfg: MoEText) -> MoEBlockConfig:
        """The block of a Qwen3-VL-MoE sparse layer: one slot, no shared experts, no biases."""
        if cfg.moe is None:
            raise ConfigError(
                "MoEBlockConfig.for_text needs a text config with MoE settings (cfg.moe is None)"
            )
        return cls(
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.moe.moe_intermediate_size,
            num_routed_experts=cfg.moe.num_experts,
            select_experts_k=cfg.moe.num_experts_per_tok,
        )

    @classmethod
    def from_yaml(cls, text: str, source: str = "<yaml>") -> MoEBlockConfig:
        """Parse the YAML form (module docstring); errors are prefixed with `source`."""
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{source}: not valid YAML ({e})") from e
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{source}: an MoE block config must be a YAML mapping, got {type(raw).__name__}"
            )
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(str(key) for key in set(raw) - set(allowed))
        if unknown:
            raise ConfigError(f"{source}: unknown field(s) {unknown}; allowed: {allowed}")
        raw = dict(raw)
        if raw.get("expert_mapping") == SEQUENTIAL:
            raw["expert_mapping"] = None
        elif "expert_mapping" in raw:
            raw["expert_mapping"] = _slot_list(
                "expert_mapping", raw["expert_mapping"], source, f"'{SEQUENTIAL}' or "
            )
        if raw.get("shared_expert_ids_to_slots") == FULLY_REPLICATED:
            raw["shared_expert_ids_to_slots"] = None
        elif "shared_expert_ids_to_slots" in raw:
            raw["shared_expert_ids_to_slots"] = _shared_map(raw["shared_expert_ids_to_slots"], source)
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in raw]
        if missing:
            raise ConfigError(f"{source}: missing field(s) {missing}")
        try:
            return cls(**raw)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def load(cls, path: str | Path) -> MoEBlockConfig:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read MoE block config ({e})") from e
        return cls.from_yaml(text, str(path))


def _is_slot(value: Any, slots: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < slots


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _slot_list(name: str, value: Any, source: str, alternative: str = "") -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ConfigError(f"{source}: {name} must be {alternative}a list of slot numbers, got {value!r}")
    return tuple(value)


def _shared_map(value: Any, source: str) -> dict[int, tuple[int, ...]]:
    if not isinstance(value, dict):
        raise ConfigError(
            f"{source}: shared_expert_ids_to_slots must be '{FULLY_REPLICATED}' or a mapping "
            f"{{shared expert id: [slots]}}, got {value!r}"
        )
    out = {}
    for sid, slots in value.items():
        if isinstance(sid, bool) or not isinstance(sid, int):
            raise ConfigError(
                f"{source}: shared_expert_ids_to_slots key {sid!r} must be an expert id (integer)"
            )
        out[sid] = _slot_list(f"shared_expert_ids_to_slots[{sid}]", slots, source)
    return out
