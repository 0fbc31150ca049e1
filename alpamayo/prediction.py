"""Input and output types of one driving prediction, shared by the runtime, the ZeroMQ node and replay.

Frames (SI units, Alpamayo conventions):
  * ego frame at t0: x forward, y left, z up, metres; origin at the rear-axle centre on the ground;
  * times are integer nanoseconds on the recording's (or vehicle's) monotonic clock;
  * the trajectory has 64 waypoints at 10 Hz, t = 0.1 .. 6.4 s after t0.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

# The model's timing, defined here only (tests/test_timing_constants.py): every window, history, plan and
# clock conversion imports these.
DT_S = 0.1  # the model's frame, pose and waypoint spacing (10 Hz)
PERIOD_NS = 100_000_000  # DT_S in ns
PERIOD_US = 100_000  # DT_S in us
HISTORY_STEPS = 16  # ego poses at 10 Hz ending at t0: t0 - 1.5 s .. t0
FUTURE_STEPS = 64  # waypoints at 10 Hz after t0: t0 + 0.1 s .. t0 + 6.4 s
FRAMES_PER_CAMERA = 4  # t0-0.3, -0.2, -0.1, 0 s


@dataclass(frozen=True)
class EgoHistory:
    """16 ego poses at 10 Hz, oldest first, the last one at t0, in any fixed world frame.

    xyz [16, 3] metres; quat_xyzw [16, 4] unit quaternions (x, y, z, w) giving the ego->world rotation;
    t_ns [16] strictly increasing. The runtime converts them to the t0 ego frame:
    xyz_local = R_t0^-1 (xyz_world - xyz_t0).
    """

    xyz: np.ndarray
    quat_xyzw: np.ndarray
    t_ns: np.ndarray


@dataclass
class TrajectorySample:
    """One sampled (reasoning, trajectory) pair."""

    reasoning: str  # chain-of-causation text between <|cot_start|> and <|cot_end|>
    reasoning_token_ids: list[int]
    token_ids: list[int]  # the 128 future-trajectory token ids, checkpoint vocabulary (empty: action expert)
    actions: np.ndarray  # [64, 2] float64: acceleration m/s^2, curvature 1/m
    xyz: np.ndarray  # [64, 3] float64 metres, t0 ego frame
    heading: np.ndarray  # [64] float64 rad, yaw in the t0 ego frame
    reasoning_capped: bool = False  # the reasoning hit its length cap and <|traj_future_start|> was forced


@dataclass
class Prediction:
    """Result of `AlpamayoVLA.predict`: one or more samples sharing one prefill, with per-stage timings."""

    samples: list[TrajectorySample]
    t_s: np.ndarray = field(
        default_factory=lambda: DT_S * np.arange(1, FUTURE_STEPS + 1)
    )  # [64] seconds after t0
    timings_ms: dict[str, float] = field(default_factory=dict)  # stage name (alpamayo.profiling.STAGES) -> ms
    # "expert" (flow-matching action expert: samples carry no trajectory tokens) or "tokens" (discrete decoder)
    decoder: str = "tokens"
    flow: dict[str, Any] | None = None  # the expert's settings: steps, temperature, guidance (None: tokens)
    draft: str = "none"  # the speculative draft of the reasoning (`alpamayo.drafts`)
    # per sample row, per speculative block: the tokens it produced (accepted drafts + 1); empty without a draft
    accepted_lengths: list[list[int]] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verify over every row's blocks (None without a draft)."""
        blocks = [n for row in self.accepted_lengths for n in row]
        return sum(blocks) / len(blocks) if blocks else None

    @property
    def best(self) -> TrajectorySample:
        """The first sample (the greedy one when decoding greedily)."""
        return self.samples[0]

    def waypoints(self, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Sample k's trajectory as every output sends it: xyz [T, 3] metres and heading [T] rad, float64 in the
        t0 ego frame, one per time of `t_s` (T of them); a ValueError names the shapes when they do not match.
        The node publishes sample 0's; the AlpaSim service converts the one it selects to the scene's frame."""
        sample = self.samples[k]
        xyz, heading = np.asarray(sample.xyz, np.float64), np.asarray(sample.heading, np.float64)
        if xyz.shape != (len(self.t_s), 3) or heading.shape != (len(self.t_s),):
            raise ValueError(
                f"waypoints {list(xyz.shape)}, heading {list(heading.shape)} for {len(self.t_s)} times"
            )
        return xyz, heading


@dataclass
class Answer:
    """The answer to a question about the camera frames (`AlpamayoVLA.ask`): its text (up to
    `<|answer_end|>`, specials dropped), the generated token ids, whether the length cap ended it first, and
    the stage timings in ms."""

    text: str
    token_ids: list[int]
    capped: bool
    timings_ms: dict[str, float] = field(default_factory=dict)


class PredictionCancelled(Exception):
    """Raised at a step boundary of a prediction whose `Cancellation` was set: the prediction is abandoned and
    returns nothing. The model stays usable: the next prediction prefills its prompt afresh."""


class Cancellation:
    """Stops a running prediction within one step, from any thread: its owner (the node, on shutdown) calls
    `cancel`; the runtime passes it down and the loops call `check` between vision encodes, decode steps,
    speculative verify blocks and Euler steps, on either backend (the ttnn loops are host loops too). One
    step is the latency: a prefill or one frame's vision encode is not interrupted."""

    def __init__(self) -> None:
        self._set = threading.Event()

    def cancel(self) -> None:
        self._set.set()

    @property
    def cancelled(self) -> bool:
        return self._set.is_set()

    def check(self) -> None:
        """Raise `PredictionCancelled` once `cancel` has been called."""
        if self._set.is_set():
            raise PredictionCancelled("prediction cancelled")


class Predictor(Protocol):
    """What the node and replay call once per tick (implemented by `AlpamayoVLA`).

    frames: camera index -> 4 HxWx3 uint8 RGB frames, oldest first (t0-0.3 .. t0 s);
    frame_times_ns: the same layout with each frame's start-of-frame time, used to cache per-frame vision
    features (only new frames are encoded at each tick); route: optional navigation text; cancel: stops the
    prediction within one step (`PredictionCancelled`).
    """

    def predict(
        self,
        frames: Mapping[int, Sequence[np.ndarray]],
        ego_history: EgoHistory,
        route: str | None = None,
        num_samples: int = 1,
        seed: int | None = None,
        frame_times_ns: Mapping[int, Sequence[int]] | None = None,
        stream: str | None = None,
        cancel: Cancellation | None = None,
    ) -> Prediction: ...

    def reset(self) -> None:
        """Forget per-frame state cached by frame time (a camera restarted, its clock may repeat times)."""
