"""Open-loop accuracy of replayed predictions against the recorded future, per horizon (planner.metrics).

Per tick and horizon h (1, 2, 3, 6.4 s): ADE@h of sample 0 (the greedy one when decoding greedily), FDE@h
(its displacement at h) and minADE_K@h (NVIDIA's definition: ADE@h of the sample whose 6.4 s ADE is the
smallest, `planner.metrics.min_ade_at_horizons`). Validity: 64 finite waypoints and headings.
Beside the model, the constant-velocity baseline (`planner.baselines`) is scored on the same ticks: a model
worth running beats it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpamayo.prediction import FUTURE_STEPS, EgoHistory, Prediction
from alpamayo.replay.results import TickResult
from planner.baselines import constant_velocity
from planner.ego_frame import to_t0_frame
from planner.metrics import HORIZONS_S, ade, horizon_errors, min_ade_at_horizons

METRICS = ("ade", "fde", "min_ade")


def error_key(metric: str, horizon_s: float) -> str:
    return f"{metric}@{horizon_s:g}s"


# Every metric at every horizon, as `tick_errors` keys them ("ade@1s", "fde@1s", "min_ade@1s", "ade@2s", ...).
ERROR_KEYS = tuple(error_key(m, h) for h in HORIZONS_S for m in METRICS)


def invalid_reasons(prediction: Prediction) -> list[str]:
    """Why a prediction cannot be used (empty when it can)."""
    reasons = []
    for k, sample in enumerate(prediction.samples):
        if sample.xyz.shape != (FUTURE_STEPS, 3) or sample.heading.shape != (FUTURE_STEPS,):
            reasons.append(f"sample {k}: waypoints {list(sample.xyz.shape)}, expected [{FUTURE_STEPS}, 3]")
        elif not (np.isfinite(sample.xyz).all() and np.isfinite(sample.heading).all()):
            reasons.append(f"sample {k}: non-finite waypoints or headings")
    if not prediction.samples:
        reasons.append("no samples")
    return reasons


def tick_errors(predicted: np.ndarray, recorded: np.ndarray | None) -> dict[str, float] | None:
    """predicted [K, 64, 3], recorded [64, 3] (t0 ego frame, metres) -> {"ade@1s": m, ...}; None without a
    recorded future or with non-finite predictions."""
    if recorded is None or not np.isfinite(predicted).all():
        return None
    at = horizon_errors(predicted[0], recorded)
    best = min_ade_at_horizons(predicted, recorded)
    errors = {}
    for h in HORIZONS_S:
        errors[error_key("ade", h)] = float(ade(predicted[0], recorded, h))
        errors[error_key("fde", h)] = float(at[h])
        errors[error_key("min_ade", h)] = best[h]
    return errors


def score_tick(
    seq: int,
    t0_ns: int,
    ego: EgoHistory,
    prediction: Prediction,
    future: tuple[np.ndarray, np.ndarray] | None,
    reasons: list[str],
    decode_tokens: int,
) -> TickResult:
    """The result of `prediction` answering the tick at t0_ns, scored against the recorded `future` (xyz
    [64, 3] m, heading [64] rad in the t0 ego frame, or None); `reasons` why it is invalid. The replay mode
    fills in stages_ms, e2e_ms and warmup."""
    predicted = np.stack([s.xyz for s in prediction.samples])
    future_xyz = None if future is None else future[0]
    return TickResult(
        seq=seq,
        t0_ns=t0_ns,
        warmup=False,
        predicted_xyz=predicted,
        future_xyz=future_xyz,
        history_xyz=to_t0_frame(ego).xyz,
        errors_m=tick_errors(predicted, future_xyz),
        invalid_reasons=reasons,
        stages_ms={},
        e2e_ms=0.0,
        decode_tokens=decode_tokens,
        trajectory_tokens=len(prediction.best.token_ids),
        accepted_lengths=[n for row in prediction.accepted_lengths for n in row],
    )


@dataclass(frozen=True)
class AccuracySummary:
    """Mean errors (metres) over the measured ticks that have a recorded future."""

    ticks: int
    with_future: int
    valid: int
    samples: int
    mean_m: dict[str, float]
    baseline_ade_m: dict[str, float]  # constant-velocity ADE per horizon ("ade@1s", ...)

    def as_dict(self) -> dict:
        return {
            "ticks": self.ticks,
            "with_future": self.with_future,
            "valid": self.valid,
            "samples": self.samples,
            "mean_m": self.mean_m,
            "constant_velocity_ade_m": self.baseline_ade_m,
        }

    def table(self) -> str:
        header = (
            f"Accuracy vs the recorded future: {self.with_future} of {self.ticks} ticks have a 6.4 s future; "
            f"valid {self.valid}/{self.ticks}"
        )
        if not self.mean_m:
            return header + "\n(no tick has a recorded future: nothing to compare)"
        rows = [
            header,
            f"{'horizon':>8} {'ADE m':>9} {'FDE m':>9} {f'minADE_{self.samples} m':>12} {'const-vel ADE m':>16}",
        ]
        for h in HORIZONS_S:
            values = [self.mean_m[error_key(m, h)] for m in METRICS]
            baseline = self.baseline_ade_m[error_key("ade", h)]
            rows.append(f"{h:>7g}s {values[0]:>9.3f} {values[1]:>9.3f} {values[2]:>12.3f} {baseline:>16.3f}")
        return "\n".join(rows)


def baseline_ade(histories_xyz: Sequence[np.ndarray], futures_xyz: Sequence[np.ndarray]) -> dict[str, float]:
    """Mean constant-velocity ADE per horizon ({"ade@1s": m, ...}; {} for no ticks) over ticks given by their
    history [16, 3] and recorded future [64, 3] (t0 ego frame, metres)."""
    if not histories_xyz:
        return {}
    predicted = [constant_velocity(history) for history in histories_xyz]
    return {
        error_key("ade", h): float(
            np.mean([ade(p, g, h) for p, g in zip(predicted, futures_xyz, strict=True)])
        )
        for h in HORIZONS_S
    }


def summarize_accuracy(ticks: Sequence[TickResult]) -> AccuracySummary:
    """Mean model errors and constant-velocity ADE over the ticks that have a recorded future."""
    scored = [t for t in ticks if t.errors_m is not None]
    mean = {k: float(np.mean([t.errors_m[k] for t in scored])) for k in ERROR_KEYS} if scored else {}
    baseline = baseline_ade([t.history_xyz for t in scored], [t.future_xyz for t in scored])
    samples = ticks[0].predicted_xyz.shape[0] if ticks else 0
    return AccuracySummary(len(ticks), len(scored), sum(t.valid for t in ticks), samples, mean, baseline)
