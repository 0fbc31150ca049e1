"""What the torch backend quantises: the mode, the int4 group size and whether the head is included."""

from __future__ import annotations

from dataclasses import dataclass

QUANT_MODES = ("none", "int8", "int4")
GROUP_SIZES = (32, 64, 128)
# 128 is the group size torchao and gpt-fast default to for int4 weight-only: 1/8 of the int4 bytes again for
# the bf16 scale and zero of each group at 32, 1/32 at 128 (see docs/quantisation.md for the fidelity of each).
DEFAULT_GROUP_SIZE = 128

# Linear roles (`alpamayo.text.linear.Linear.role`): "head" is quantised only with `QuantRecipe.head`;
# "router" (MoE top-k gates) never is, since a flipped expert choice changes a whole token's MLP output;
# "embedding" (the action expert's Fourier in-projection, its counterpart of a token embedding) never is.
ROLES = ("body", "head", "router", "embedding")
# The model's parts that hold linears, keyed as `alpamayo.plan.gpu_memory.weight_counts` keys them, named as the
# load's int8-fallback line (`alpamayo.text.linear.pack_linears`) and the plan name them.
PART_NAMES = {"text": "text backbone", "vision": "vision tower", "expert": "action expert"}


@dataclass(frozen=True)
class QuantRecipe:
    """mode: "none", "int8" (per-output-channel symmetric) or "int4" (group-wise asymmetric, `group_size`
    input columns per scale and zero); head: quantise the LM head (and the expert's output projection) too."""

    mode: str = "none"
    group_size: int = DEFAULT_GROUP_SIZE
    head: bool = False

    def __post_init__(self) -> None:
        if self.mode not in QUANT_MODES:
            raise ValueError(f"quant must be one of {list(QUANT_MODES)}, got {self.mode!r}")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"quant group size must be one of {list(GROUP_SIZES)}, got {self.group_size}")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def applies_to(self, role: str) -> bool:
        """Whether a linear of `role` ("body", "head", "router", "embedding") is quantised under this recipe."""
        if role not in ROLES:
            raise ValueError(f"linear role must be one of {list(ROLES)}, got {role!r}")
        return self.enabled and (role == "body" or (role == "head" and self.head))

    @property
    def name(self) -> str:
        """What outputs record as the precision suffix: "int8", "int4-g128", "int4-g128+head"; "" for none."""
        if not self.enabled:
            return ""
        base = self.mode if self.mode == "int8" else f"int4-g{self.group_size}"
        return base + ("+head" if self.head else "")

    @classmethod
    def parse(cls, spec: str, head: bool = False) -> QuantRecipe:
        """The recipe `name` writes ("int8", "int4-g32", "int4-g128+head"), or "int4" for the default group
        size; `head` also quantises the head. ValueError naming `spec` and the allowed forms."""
        body, plus, suffix = spec.partition("+")
        mode, _, group = body.partition("-g")
        allowed = ", ".join(["int8", "int4", *(f"int4-g{g}" for g in GROUP_SIZES)])
        if (plus and suffix != "head") or mode not in ("int8", "int4") or (group and mode != "int4"):
            raise ValueError(f"quant recipe {spec!r} unknown; allowed: {allowed} (each optionally +head)")
        if group and (not group.isdigit() or int(group) not in GROUP_SIZES):
            raise ValueError(
                f"quant recipe {spec!r}: group size {group!r} not one of {list(GROUP_SIZES)}; allowed: {allowed}"
            )
        return cls(mode, int(group) if group else DEFAULT_GROUP_SIZE, head or bool(plus))


NO_QUANT = QuantRecipe()
