"""The expected time of a stage on one p150: the roofline (`alpamayo.plan.estimate`) scaled per op class by an
efficiency, plus the fixed costs the roofline leaves out, each fitted to published single-p150
measurements (`p150_anchors.json`, `alpamayo.plan.calibration.anchors`).

One coefficient per class, no more:

  * `dram_matmul`: a matmul the roofline finds DRAM-bound (decode, verify, the expert's and the draft's rows),
    its weight reads at 1/k of the 512 GB/s. Anchors: Qwen3-VL-32B's decode QKV, O, gate and down matmuls,
    DRAM-sharded with 2 workers per bank, 0.124-0.19 ms each (the seed `001_7f36aaf208414fee.txt`).
  * `compute_matmul`: a matmul the roofline finds compute-bound (prefill, vision tower), its FLOPs at 1/k of
    the peak. The P150 runs its Tensix clock at 800 MHz, not the 1.35 GHz the roofline takes, so k holds that
    factor too. Anchor: Llama-3.1-8B's time to first token at 1024 prompt tokens minus at 128 through vLLM
    (tt-inference-server issue 195, May 2025): the only published long-prompt single-p150 figure found; the
    first prompt-length profile from `scripts/card-check` should replace it.
  * `lm_head`: the interleaved 1-D lm_head, its reads at 1/k of the bandwidth. Anchor: Qwen3-VL-32B's 2.3 ms.
  * `sdpa`: flash-decode and prefill attention at 1/k of their roofline, and `sdpa_op`, a fixed cost per
    attention op. Anchors: the flash-decode op at Llama-3.1-8B's shape at 512, 1024 and 1792 positions
    (9.9-24.7 us: morjun/tt-metal's profile of tt-metal's kernel). Prefill attention has no anchor of its own.
  * `layer_traced`: the rest of a decoder layer in a traced pass (norms, rotary, head reshapes, K/V cache
    writes, residual adds, each op's launch), in ms per layer. Anchors: Llama-3.1-8B's whole decode step
    through tt_transformers at batch 1 and 32 (23.8-25.8 ms), given the classes above. An MoE layer counts
    as its device programs against a dense layer's (57 / 29, the dry run's graph capture).
  * `layer_untraced`: the same per layer of a pass dispatched op by op from the host (prefill, and the
    vision tower, block for block). Anchors: Llama-3.1-8B's time to first token at 128 and 145 tokens.
  * `host`: host <-> device copies in ms per MB (token ids, logits rows, image patches and embeddings).
    Anchor: Qwen3-VL-32B's logits row, 0.06 ms for 304 KB.

Expected = sum over classes of coefficient x feature (`features`): roofline ms for the efficiency classes,
counts and bytes for the fixed ones. Every efficiency coefficient is bounded below by 1 and every fixed cost
by 0, so expected >= roofline for every stage by construction. The fit is one weighted linear least-squares
over the fitted anchors (each residual relative to its measurement) with a weak pull toward the roofline
(coefficient 1, fixed cost 0), which decides only where no anchor does: a class left without anchors in a
leave-one-out fit predicts its roofline.

Fitted to the package's anchors (tests/test_plan_calibration.py holds these figures to the fit):

    dram_matmul     efficiency 0.77
    compute_matmul  efficiency 0.10
    lm_head         efficiency 0.70
    sdpa            efficiency 0.36
    sdpa_op         4.2 us per op
    layer_traced    0.32 ms per layer
    layer_untraced  1.33 ms per layer
    host            0.20 ms per MB
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from scipy.optimize import lsq_linear

from alpamayo.plan.calibration.anchors import ANCHORS_PATH, Anchor, load_anchors
from alpamayo.plan.calibration.workloads import stages
from alpamayo.plan.device_spec import P150, DeviceSpec
from alpamayo.plan.estimate import OpCost, StageEstimate


@dataclass(frozen=True)
class OpClass:
    name: str
    kind: str  # "efficiency": a multiplier of roofline ms (>= 1); "fixed": ms per unit (>= 0)
    unit: str  # what the feature counts
    what: str


CLASSES = (
    OpClass("dram_matmul", "efficiency", "roofline ms", "DRAM-bound matmuls (decode, verify, expert, draft)"),
    OpClass("compute_matmul", "efficiency", "roofline ms", "compute-bound matmuls (prefill, vision tower)"),
    OpClass("lm_head", "efficiency", "roofline ms", "lm_head"),
    OpClass("sdpa", "efficiency", "roofline ms", "attention (flash-decode and prefill SDPA)"),
    OpClass("sdpa_op", "fixed", "op", "fixed cost per attention op"),
    OpClass("layer_traced", "fixed", "layer", "norms, eltwise, residual, cache writes per traced layer"),
    OpClass("layer_untraced", "fixed", "layer", "the same per host-dispatched layer (prefill, vision)"),
    OpClass("host", "fixed", "MB", "host <-> device copies"),
)
NAMES = tuple(c.name for c in CLASSES)
PRIOR = np.array([1.0 if c.kind == "efficiency" else 0.0 for c in CLASSES])
LOWER = PRIOR.copy()
# The pull toward the roofline, in units of each coefficient's typical size (relative residuals are O(1)):
# small enough that no anchored class moves measurably, large enough to pin an unanchored one.
RIDGE = 1e-3
FIT_TOLERANCE = 0.20  # every fitted anchor within +-20 % of its measurement (tests/test_plan_calibration.py)
SCALE = np.array([1.0, 1.0, 1.0, 1.0, 0.005, 0.3, 1.0, 0.2])


def op_class(op: OpCost, device: DeviceSpec = P150) -> str:
    """The class of one roofline op: attention, the lm_head, or a matmul by what bounds it in the roofline."""
    if ".sdpa." in op.name or op.name == "flash-decode":
        return "sdpa"
    if op.name == "lm_head":
        return "lm_head"
    return "compute_matmul" if op.bound(device) == "compute" else "dram_matmul"


def features(stage: StageEstimate, device: DeviceSpec = P150) -> np.ndarray:
    """What one pass of `stage` puts in each class (`CLASSES` order): roofline ms of its ops per efficiency
    class, its attention ops, its layers (traced or not) and its host MB."""
    f = np.zeros(len(CLASSES))
    for op in stage.ops:
        cls = op_class(op, device)
        f[NAMES.index(cls)] += 1e3 * op.seconds(device)
        if cls == "sdpa":
            f[NAMES.index("sdpa_op")] += 1
    f[NAMES.index("layer_traced" if stage.traced else "layer_untraced")] += stage.layers
    f[NAMES.index("host")] += stage.host_bytes / 1e6
    return f


def workload_features(workload: dict, device: DeviceSpec = P150) -> np.ndarray:
    """The features of an anchor's workload (its signed passes summed), restricted to `op_class` if given."""
    f = sum(sign * features(stage, device) for sign, stage in stages(workload))
    only = workload.get("op_class")
    if only is not None:
        mask = np.array([n == only or (only == "sdpa" and n == "sdpa_op") for n in NAMES])
        f = np.where(mask, f, 0.0)
    return np.asarray(f, dtype=float)


@dataclass(frozen=True)
class ExpectedModel:
    """Fitted coefficients (`CLASSES` order) and the anchors they came from."""

    coef: np.ndarray
    anchor_ids: tuple[str, ...]

    def value(self, name: str) -> float:
        return float(self.coef[NAMES.index(name)])

    def pass_ms(self, stage: StageEstimate, device: DeviceSpec = P150) -> float:
        """Expected ms of one pass of `stage`."""
        return float(features(stage, device) @ self.coef)

    def ms(self, stage: StageEstimate, device: DeviceSpec = P150) -> float:
        """Expected ms of all of a stage's passes in one prediction."""
        return self.pass_ms(stage, device) * stage.repeat

    def by_class(self, stage: StageEstimate, device: DeviceSpec = P150) -> dict[str, float]:
        """Expected ms of all the stage's passes per class (ms of `sdpa_op` folded into `sdpa`)."""
        parts = features(stage, device) * self.coef * stage.repeat
        out = {n: float(p) for n, p in zip(NAMES, parts, strict=True) if n != "sdpa_op"}
        out["sdpa"] += float(parts[NAMES.index("sdpa_op")])
        return out

    def predict(self, anchor: Anchor) -> float:
        """Modelled ms of an anchor's workload."""
        return float(workload_features(anchor.workload) @ self.coef)

    def describe(self) -> list[str]:
        lines = []
        for c, k in zip(CLASSES, self.coef, strict=True):
            if c.kind == "efficiency":
                lines.append(f"  {c.name:<15} efficiency {1 / k:6.3f} (x{k:.2f} the roofline)  {c.what}")
            else:
                per = {"op": "us per op", "layer": "ms per layer", "MB": "ms per MB"}[c.unit]
                value = k * 1e3 if c.unit == "op" else k
                lines.append(f"  {c.name:<15} {value:8.3f} {per:<14} {c.what}")
        return lines


def fit(anchors: Iterable[Anchor], device: DeviceSpec = P150) -> ExpectedModel:
    """The coefficients that best fit the anchors marked `fit` (relative residuals, bounded, with the weak
    pull toward the roofline described in the module docstring)."""
    rows = [a for a in anchors if a.fit]
    a = np.array([workload_features(r.workload, device) / r.measured_ms for r in rows]).reshape(
        -1, len(NAMES)
    )
    b = np.ones(len(rows))
    reg = np.diag(np.sqrt(RIDGE) / SCALE)
    a = np.vstack([a, reg])
    b = np.concatenate([b, reg @ PRIOR])
    result = lsq_linear(a, b, bounds=(LOWER, np.inf), method="bvls")
    return ExpectedModel(result.x, tuple(r.id for r in rows))


@dataclass(frozen=True)
class Check:
    """One anchor's measured and modelled figures, and modelled by a fit without it (fitted anchors)."""

    anchor: Anchor
    modelled_ms: float
    left_out_ms: float | None

    @property
    def ratio(self) -> float:
        return self.modelled_ms / self.anchor.measured_ms

    @property
    def left_out_ratio(self) -> float | None:
        return None if self.left_out_ms is None else self.left_out_ms / self.anchor.measured_ms


def calibration(anchors: list[Anchor], device: DeviceSpec = P150) -> tuple[ExpectedModel, list[Check]]:
    """The model fitted to `anchors` and every anchor checked against it; fitted ones also leave-one-out."""
    model = fit(anchors, device)
    checks = []
    for a in anchors:
        left = None
        if a.fit:
            without = fit([b for b in anchors if b.id != a.id], device)
            left = without.predict(a)
        checks.append(Check(a, model.predict(a), left))
    return model, checks


@cache
def fitted(*extra: Path) -> ExpectedModel:
    """The model fitted to the package's anchors and the rows of the `extra` anchor files."""
    anchors = load_anchors(ANCHORS_PATH)
    for path in extra:
        anchors += load_anchors(path)
    return fit(anchors)
