"""Trajectory tokenizers (Alpamayo's delta history tokenizer and discrete future tokenizer) and the checkpoint
token ids they map to.

Binning (both tokenizers): a value v in [lo, hi] becomes bin round((v - lo) / (hi - lo) * (n - 1)), clamped to
[0, n - 1], so the n bin values are lo + b (hi - lo) / (n - 1), with lo and hi themselves representable.

Token ids are looked up through the checkpoint tokenizer by their strings, never computed: future bin b is
`<i{b}>`, history bin b is `<i{F + b}>` (F = number of future bins, 3000), and the markers are `<|...|>`.
Alpamayo 2 Super reverses the two ranges: history bin b is `<i{b}>`, future bin b is `<i{H + b}>` (H = 1000).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from alpamayo.families.vocabulary import bin_token, marker
from alpamayo.prediction import HISTORY_STEPS
from planner.checks import require_bins, require_finite, require_shape
from planner.settings import (
    ActionSpaceSettings,
    FutureTokenizerSettings,
    HistoryTokenizerSettings,
    PlannerSettings,
)

# Marker tokens the planner and the generation loop use, by role. `<|traj_history|>` is the placeholder the
# history tokens replace; the others delimit the reasoning and the trajectory.
MARKERS = (
    "traj_history_start",
    "traj_history",
    "traj_history_end",
    "traj_future_start",
    "traj_future_end",
    "cot_start",
    "cot_end",
    "route_start",
    "route_end",
    "answer_end",
)


def quantize(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, num_bins: int) -> np.ndarray:
    """Uniform bins over [lo, hi] (broadcast over the last axis), clamped: int64 in [0, num_bins)."""
    scaled = (values - lo) / (hi - lo) * (num_bins - 1)
    return np.clip(np.round(scaled), 0, num_bins - 1).astype(np.int64)


def dequantize(bins: np.ndarray, lo: np.ndarray, hi: np.ndarray, num_bins: int) -> np.ndarray:
    """The value of each bin, float64 (inverse of `quantize` for values inside [lo, hi])."""
    return lo + np.asarray(bins, dtype=np.float64) / (num_bins - 1) * (hi - lo)


class HistoryTokenizer:
    """16 ego positions in the t0 frame -> per-step xyz deltas -> 48 (or 45) bins, x/y/z interleaved per step."""

    def __init__(self, settings: HistoryTokenizerSettings | None = None):
        self.settings = settings = settings or HistoryTokenizerSettings()
        self.lo, self.hi = np.array(settings.xyz_min), np.array(settings.xyz_max)

    @property
    def num_tokens(self) -> int:
        return self.settings.num_tokens

    def encode(self, xyz_local: np.ndarray) -> np.ndarray:
        """xyz [16, 3] metres, t0 ego frame, oldest first -> bins [num_tokens] int64.

        Origin-padded (Alpamayo 1 / 1.5): the deltas are xyz[0] - 0, xyz[1] - xyz[0], ...; otherwise the first
        one is dropped. Deltas beyond [xyz_min, xyz_max] clamp to the end bins (the released tokenizer does so).
        """
        xyz = np.asarray(xyz_local, dtype=np.float64)
        require_shape("history xyz", xyz, (HISTORY_STEPS, 3))
        require_finite("history xyz", xyz)
        if self.settings.pad_origin:
            xyz = np.concatenate([np.zeros((1, 3)), xyz])
        return quantize(np.diff(xyz, axis=0), self.lo, self.hi, self.settings.num_bins).reshape(-1)

    def decode(self, bins: np.ndarray) -> np.ndarray:
        """Bins -> positions [n_deltas, 3]: the cumulative sum of the binned deltas (relative to the origin when
        origin-padded, else to the oldest pose)."""
        bins = require_bins("history bins", bins, self.num_tokens, self.settings.num_bins)
        deltas = dequantize(bins.reshape(-1, 3), self.lo, self.hi, self.settings.num_bins)
        return np.cumsum(deltas, axis=0)


class FutureTokenizer:
    """64 x (acceleration m/s^2, curvature 1/m) -> 128 bins, accel and curvature interleaved per waypoint.

    Each value is normalised with the checkpoint's mean/std, clipped to [dims_min, dims_max] and binned.
    """

    def __init__(
        self,
        settings: FutureTokenizerSettings | None = None,
        action_space: ActionSpaceSettings | None = None,
    ):
        settings, action_space = settings or FutureTokenizerSettings(), action_space or ActionSpaceSettings()
        self.settings, self.n_waypoints = settings, action_space.n_waypoints
        self.mean = np.array([action_space.accel_mean, action_space.curvature_mean])
        self.std = np.array([action_space.accel_std, action_space.curvature_std])
        self.lo, self.hi = np.array(settings.dims_min), np.array(settings.dims_max)

    @property
    def num_tokens(self) -> int:
        return 2 * self.n_waypoints

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """actions [64, 2] (accel, curvature) physical units -> bins [128] int64."""
        actions = np.asarray(actions, dtype=np.float64)
        require_shape("actions", actions, (self.n_waypoints, 2))
        require_finite("actions", actions)
        normalised = (actions - self.mean) / self.std
        return quantize(normalised, self.lo, self.hi, self.settings.num_bins).reshape(-1)

    def decode(self, bins: np.ndarray) -> np.ndarray:
        """bins [128] -> actions [64, 2] float64 (accel m/s^2, curvature 1/m)."""
        bins = require_bins("future bins", bins, self.num_tokens, self.settings.num_bins)
        normalised = dequantize(bins.reshape(-1, 2), self.lo, self.hi, self.settings.num_bins)
        return normalised * self.std + self.mean


@dataclass(frozen=True)
class TrajectoryVocab:
    """Checkpoint token ids of the trajectory vocabulary, resolved by string through its tokenizer.

    future_ids [F] int64: id of `<i{b}>` for future bin b; history_ids [H]: id of `<i{F + b}>` for history bin b
    (history_first, Super: history_ids of `<i{b}>`, future_ids of `<i{H + b}>`);
    markers: `MARKERS` name -> id (`route_start`/`route_end`/`answer_end` only when the tokenizer has them).
    """

    future_ids: np.ndarray
    history_ids: np.ndarray
    markers: dict[str, int]

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        settings: PlannerSettings | None = None,
        vocab_size: int | None = None,
        history_first: bool = False,
    ) -> TrajectoryVocab:
        """Look every trajectory token up in `tokenizer`; `vocab_size` (embedding rows) bounds the ids;
        `history_first`: the `<iN>` range starts with the history bins (Alpamayo 2 Super)."""
        settings = settings or PlannerSettings()
        table = tokenizer.get_vocab()
        strings = [bin_token(i) for i in range(settings.traj_vocab_size)]
        missing = [s for s in strings if s not in table]
        optional = ("route_start", "route_end", "answer_end")
        missing += [marker(m) for m in MARKERS if marker(m) not in table and m not in optional]
        name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        if missing:
            raise ValueError(
                f"{name}: {len(missing)} trajectory token(s) missing from the vocabulary, first {missing[:5]}; "
                f"a trajectory checkpoint needs <i0>..{strings[-1]} and the Alpamayo markers"
            )
        ids = np.array([table[s] for s in strings], dtype=np.int64)
        markers = {m: table[marker(m)] for m in MARKERS if marker(m) in table}
        if vocab_size is not None:
            top = max(int(ids.max()), *markers.values())
            if top >= vocab_size:
                raise ValueError(
                    f"{name}: trajectory token id {top} is outside the model's embedding table [0, {vocab_size})"
                )
        if history_first:
            n_history = settings.history.num_bins
            return cls(future_ids=ids[n_history:], history_ids=ids[:n_history], markers=markers)
        n_future = settings.future.num_bins
        return cls(future_ids=ids[:n_future], history_ids=ids[n_future:], markers=markers)

    def marker(self, name: str) -> int:
        """Id of marker `name` (e.g. 'traj_future_start')."""
        try:
            return self.markers[name]
        except KeyError:
            raise ValueError(
                f"the tokenizer has no {marker(name)} token; available: {sorted(self.markers)}"
            ) from None

    def future_bins(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Future-trajectory token ids -> their bins; raises on any id that is not `<i0>`..`<i{F-1}>`."""
        token_ids = np.asarray(token_ids, dtype=np.int64)
        order = np.argsort(self.future_ids)
        pos = np.clip(np.searchsorted(self.future_ids, token_ids, sorter=order), 0, len(order) - 1)
        bins = order[pos]
        bad = np.flatnonzero(self.future_ids[bins] != token_ids)
        if len(bad):
            raise ValueError(
                f"token id {token_ids[bad[0]]} at position {bad[0]} is not a future-trajectory token "
                f"(one of the {len(self.future_ids)} future bins' <iN> tokens)"
            )
        return bins
