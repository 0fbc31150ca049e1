"""Trajectory settings of a checkpoint, read from the top-level Alpamayo keys (`ModelConfig.extra`).

Keys (Alpamayo 1 / 1.5 `config.json` spelling; every one optional, defaults are the released values):
  traj_tokenizer_cfg       {num_bins 3000, dims_min [-10, -10], dims_max [10, 10], action_space_cfg {...}}
  hist_traj_tokenizer_cfg  {num_bins 1000, ego_xyz_min [-4, -4, -10], ego_xyz_max [4, 4, 10],
                            pad_origin_at_beginning true (false in Alpamayo 2: 45 tokens)}
  action_space_cfg         {accel_mean, accel_std, curvature_mean, curvature_std, dt, n_waypoints,
                            accel_bounds, curvature_bounds, v/theta/a/kappa _lambda and _ridge}
  tokens_per_future_traj 128, tokens_per_history_traj 48, traj_vocab_size 4000 (checked when present)
`traj_tokenizer_cfg.action_space_cfg` (what the discrete tokenizer was trained with) overrides the top-level
`action_space_cfg` key by key. Alpamayo 2 Super spells the future tokenizer `future_traj_tokenizer_cfg`, keeps
its action space under `expert_config.action_space_cfg` and states `history_vocab_size` / `future_vocab_size`
(checked against the bins); the family (`alpamayo.families.Family`) says which spelling a checkpoint uses.
Hydra `_target_` / `_recursive_` keys are ignored: the settings are read as data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from alpamayo.errors import ConfigError
from alpamayo.families.registry import DEMO, Family
from alpamayo.json_fields import Fields
from alpamayo.prediction import DT_S, FUTURE_STEPS, HISTORY_STEPS


@dataclass(frozen=True)
class PlannerConfig:
    """What planner reads of a checkpoint's config, and all it reads: the top-level Alpamayo keys (`extra`, see
    the module docstring), the file they came from (named in errors), the family (key spellings, prompt policy)
    and the text vocabulary size (trajectory token ids are checked against the embedding table; None: not
    checked). The caller builds it from its `alpamayo.config.model.ModelConfig` (`alpamayo.runtime.planner_config`):
    planner sits below the models and reads no model config."""

    extra: dict[str, Any] = field(default_factory=dict)
    source: str = "config.json"
    family: Family = DEMO
    vocab_size: int | None = None


@dataclass(frozen=True)
class ActionSpaceSettings:
    """Unicycle (acceleration m/s^2, curvature 1/m) action space and the regularisation of its inverse.

    The `*_lambda` weights penalise 3rd-order (v, heading) or 2nd-order (accel, curvature) differences;
    `*_ridge` adds a small diagonal so each least-squares system stays positive definite.
    """

    dt: float = DT_S
    n_waypoints: int = FUTURE_STEPS
    accel_mean: float = 0.02903
    accel_std: float = 0.68104
    curvature_mean: float = 0.000269
    curvature_std: float = 0.026148
    accel_bounds: tuple[float, float] = (-9.8, 9.8)
    curvature_bounds: tuple[float, float] = (-0.33, 0.33)
    v_lambda: float = 1e-6
    v_ridge: float = 1e-4
    theta_lambda: float = 1e-6
    theta_ridge: float = 1e-8
    a_lambda: float = 1e-4
    a_ridge: float = 1e-4
    kappa_lambda: float = 1e-4
    kappa_ridge: float = 1e-4


@dataclass(frozen=True)
class FutureTokenizerSettings:
    """(accel, curvature) per waypoint, normalised, clipped to [dims_min, dims_max] and binned uniformly."""

    num_bins: int = 3000
    dims_min: tuple[float, float] = (-10.0, -10.0)
    dims_max: tuple[float, float] = (10.0, 10.0)


@dataclass(frozen=True)
class HistoryTokenizerSettings:
    """Per-step xyz deltas of the 16 history poses, binned uniformly over [xyz_min, xyz_max] metres."""

    num_bins: int = 1000
    xyz_min: tuple[float, float, float] = (-4.0, -4.0, -10.0)
    xyz_max: tuple[float, float, float] = (4.0, 4.0, 10.0)
    pad_origin: bool = True  # prepend the origin, so 16 deltas (48 tokens); False: 15 deltas (45 tokens)

    @property
    def num_tokens(self) -> int:
        return 3 * (HISTORY_STEPS if self.pad_origin else HISTORY_STEPS - 1)


@dataclass(frozen=True)
class PlannerSettings:
    future: FutureTokenizerSettings = FutureTokenizerSettings()
    history: HistoryTokenizerSettings = HistoryTokenizerSettings()
    action_space: ActionSpaceSettings = ActionSpaceSettings()

    @property
    def tokens_per_future(self) -> int:
        return 2 * self.action_space.n_waypoints

    @property
    def traj_vocab_size(self) -> int:
        """Trajectory tokens `<i0>`, `<i1>`, ... in the vocabulary: the future bins, then the history bins."""
        return self.future.num_bins + self.history.num_bins

    @classmethod
    def from_config(cls, cfg: PlannerConfig) -> PlannerSettings:
        return parse_planner_settings(cfg.extra, cfg.source, cfg.family)


def _ranges(section: Fields, lo_key: str, hi_key: str, lo: tuple, hi: tuple) -> tuple[tuple, tuple]:
    low, high = section.numbers(lo_key, lo), section.numbers(hi_key, hi)
    if not all(a < b for a, b in zip(low, high, strict=True)):
        raise ConfigError(
            f"{section.source}: '{section.name(lo_key)}' = {list(low)} must be below "
            f"'{section.name(hi_key)}' = {list(high)} in every dimension"
        )
    return low, high


def _action_space(root: Fields, family: Family) -> ActionSpaceSettings:
    """The family's action-space section (`action_space_cfg`; Super: `expert_config.action_space_cfg`),
    overridden by the future tokenizer's own `action_space_cfg` where both are given."""
    section = root
    for key in family.action_space_path:
        section = section.optional_sub(key)
    merged = dict(section.data)
    merged.update(root.optional_sub(family.future_key).optional_sub("action_space_cfg").data)
    s = Fields(merged, section.path, root.source)
    d = ActionSpaceSettings()
    positive = {"dt", "accel_std", "curvature_std", "v_ridge", "theta_ridge", "a_ridge", "kappa_ridge"}
    values: dict[str, Any] = {
        name: s.number(name, getattr(d, name), positive=name in positive)
        for name in (
            "dt",
            "accel_mean",
            "accel_std",
            "curvature_mean",
            "curvature_std",
            *(f"{q}_{kind}" for q in ("v", "theta", "a", "kappa") for kind in ("lambda", "ridge")),
        )
    }
    values["n_waypoints"] = s.int("n_waypoints", d.n_waypoints, minimum=2)
    for name in ("accel_bounds", "curvature_bounds"):
        bounds = s.numbers(name, getattr(d, name))
        if bounds[0] >= bounds[1]:
            raise s.fail(name, "[min, max] with min < max")
        values[name] = bounds
    return ActionSpaceSettings(**values)


def parse_planner_settings(
    extra: dict[str, Any], source: str = "config.json", family: Family = DEMO
) -> PlannerSettings:
    """`PlannerSettings` from the top-level keys of an Alpamayo `config.json` (see the module docstring)."""
    root = Fields(extra, "", source)
    fut, hist = root.optional_sub(family.future_key), root.optional_sub("hist_traj_tokenizer_cfg")
    df, dh = FutureTokenizerSettings(), HistoryTokenizerSettings()
    dims_min, dims_max = _ranges(fut, "dims_min", "dims_max", df.dims_min, df.dims_max)
    xyz_min, xyz_max = _ranges(hist, "ego_xyz_min", "ego_xyz_max", dh.xyz_min, dh.xyz_max)
    settings = PlannerSettings(
        future=FutureTokenizerSettings(fut.int("num_bins", df.num_bins, 2), dims_min, dims_max),
        history=HistoryTokenizerSettings(
            hist.int("num_bins", dh.num_bins, 2),
            xyz_min,
            xyz_max,
            hist.bool("pad_origin_at_beginning", dh.pad_origin),
        ),
        action_space=_action_space(root, family),
    )
    expected = {
        "tokens_per_future_traj": settings.tokens_per_future,
        "tokens_per_history_traj": settings.history.num_tokens,
        "traj_vocab_size": settings.traj_vocab_size,
        "history_vocab_size": settings.history.num_bins,
        "future_vocab_size": settings.future.num_bins,
    }
    for key, value in expected.items():
        if key in extra and root.int(key, value) != value:
            raise ConfigError(
                f"{source}: field '{key}' = {extra[key]} disagrees with the trajectory tokenizer settings, "
                f"which give {value}"
            )
    return settings
