"""The Alpamayo driving prompt (`helper.create_message` of Alpamayo 1 / 1.5), rendered by the checkpoint's chat
template.

    system:    "You are a driving assistant that generates safe and accurate actions."
    user:      per camera in camera-index order: ["<camera name>: "] then per frame ["frame i "] <image>;
               <|traj_history_start|> 48 x <|traj_history|> <|traj_history_end|>
               [<|route_start|>route text<|route_end|>]
               "output the chain-of-thought reasoning of the driving process, then output the future trajectory."
    assistant: "<|cot_start|>", continued (continue_final_message)

Each image renders as one `<|image_pad|>` (inside <|vision_start|>..<|vision_end|>); the VLM expands it to the
image's merged-patch count. The `<|traj_history|>` placeholders are replaced by the history bin tokens.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from alpamayo.config import ModelConfig
from alpamayo.json_fields import Fields
from alpamayo.tokenizer import chat_prompt_ids, qwen3vl_chat_template
from planner.checks import require_bins
from planner.tokenizers import TrajectoryVocab, marker

SYSTEM_PROMPT = "You are a driving assistant that generates safe and accurate actions."
INSTRUCTION = (
    "output the chain-of-thought reasoning of the driving process, then output the future trajectory."
)
# Display names of Alpamayo's camera indices (`CAMERA_DISPLAY_NAMES`); others are labelled "Camera {i}".
CAMERA_NAMES = {
    0: "Front left camera",
    1: "Front camera",
    2: "Front right camera",
    3: "Rear left camera",
    4: "Rear camera",
    5: "Rear right camera",
    6: "Front telephoto camera",
}
IMAGE_PAD = "<|image_pad|>"


@dataclass(frozen=True)
class PromptSettings:
    """Which labels precede the images: Alpamayo 1.5 writes both, Alpamayo 1 neither."""

    camera_labels: bool = True
    frame_labels: bool = True

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> PromptSettings:
        """From the checkpoint's `include_camera_ids` / `include_frame_nums` keys (both default true)."""
        extra = Fields(cfg.extra, "", cfg.source)
        return cls(extra.bool("include_camera_ids", True), extra.bool("include_frame_nums", True))


@dataclass(frozen=True)
class DrivingPrompt:
    """token_ids: the prompt with history tokens substituted and one `<|image_pad|>` per image;
    images: (camera index, frame index) of each `<|image_pad|>`, in prompt order (frames oldest first)."""

    token_ids: list[int]
    images: list[tuple[int, int]]


def camera_label(camera: int) -> str:
    return CAMERA_NAMES.get(camera, f"Camera {camera}")


def _check_cameras(cameras: Sequence[int], frames_per_camera: int) -> list[int]:
    ordered = sorted(cameras)
    if not ordered or any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in ordered):
        raise ValueError(f"cameras must be a non-empty list of camera indices >= 0, got {list(cameras)}")
    if len(set(ordered)) != len(ordered):
        raise ValueError(f"camera indices must be distinct, got {list(cameras)}")
    if not isinstance(frames_per_camera, int) or frames_per_camera < 1:
        raise ValueError(f"frames_per_camera must be an integer >= 1, got {frames_per_camera!r}")
    return ordered


def driving_messages(
    cameras: Sequence[int],
    frames_per_camera: int,
    num_history_tokens: int,
    route: str | None = None,
    settings: PromptSettings = PromptSettings(),
) -> list[dict[str, Any]]:
    """The chat messages of one driving prompt; images are `{"type": "image"}` items in camera-index order."""
    content: list[dict[str, Any]] = []
    for camera in _check_cameras(cameras, frames_per_camera):
        if settings.camera_labels:
            content.append({"type": "text", "text": f"{camera_label(camera)}: "})
        for frame in range(frames_per_camera):
            if settings.frame_labels:
                content.append({"type": "text", "text": f"frame {frame} "})
            content.append({"type": "image"})
    history = marker("traj_history") * num_history_tokens
    text = marker("traj_history_start") + history + marker("traj_history_end")
    if route is not None:
        text += marker("route_start") + route + marker("route_end")
    content.append({"type": "text", "text": text + INSTRUCTION})
    return [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
        {"role": "user", "content": content},
        {"role": "assistant", "content": [{"type": "text", "text": marker("cot_start")}]},
    ]


def _check_route(added_tokens: Collection[str], route: str) -> None:
    """Route text must be plain text: an added token inside it (a marker, `<|image_pad|>`, `<i12>`) would
    change the prompt's structure."""
    if not isinstance(route, str) or not route.strip():
        raise ValueError(f"route must be non-empty text, got {route!r}")
    inside = sorted({t for t in added_tokens if t in route})
    if inside:
        raise ValueError(f"route text {route!r} contains the reserved token(s) {inside}; pass plain text")


def build_prompt(
    tokenizer: Any,
    vocab: TrajectoryVocab,
    cameras: Sequence[int],
    frames_per_camera: int,
    history_bins: np.ndarray,
    route: str | None = None,
    settings: PromptSettings = PromptSettings(),
    added_tokens: Collection[str] | None = None,
) -> DrivingPrompt:
    """Render the driving prompt with the checkpoint's chat template (Qwen3-VL's where the tokenizer has none)
    and substitute the history bins [48 | 45].

    `added_tokens`: the tokenizer's added tokens, which the route text may not contain, when the caller has
    looked them up once (`tokenizer.get_added_vocab()` rebuilds them on every call: 2.2 ms for the 4054 of
    the demo vocabulary, more than the rest of the prompt's rendering, 0.7 ms); default: looked up here."""
    history_bins = np.asarray(history_bins)
    history_bins = require_bins("history_bins", history_bins, len(history_bins), len(vocab.history_ids))
    if route is not None:
        _check_route(tokenizer.get_added_vocab() if added_tokens is None else added_tokens, route)
    messages = driving_messages(cameras, frames_per_camera, len(history_bins), route, settings)
    # Alpamayo takes its processor, chat template included, from Qwen3-VL's hub files, so its checkpoint's
    # tokenizer may have no template; Qwen3-VL's then renders the prompt.
    ids = np.array(
        chat_prompt_ids(
            tokenizer,
            messages,
            add_generation_prompt=False,
            continue_final_message=True,
            fallback_template=qwen3vl_chat_template(),
        )
    )
    slots = np.flatnonzero(ids == vocab.marker("traj_history"))
    if len(slots) != len(history_bins):
        raise ValueError(
            f"the rendered prompt has {len(slots)} {marker('traj_history')} placeholders for "
            f"{len(history_bins)} history tokens; the chat template must keep text items verbatim"
        )
    ids[slots] = vocab.history_ids[history_bins]
    images = [(c, f) for c in sorted(cameras) for f in range(frames_per_camera)]
    n_pads = int((ids == tokenizer.convert_tokens_to_ids(IMAGE_PAD)).sum())
    if n_pads != len(images):
        raise ValueError(f"the rendered prompt has {n_pads} {IMAGE_PAD} tokens for {len(images)} images")
    return DrivingPrompt(token_ids=ids.tolist(), images=images)
