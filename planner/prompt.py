"""The Alpamayo driving prompt (`helper.create_message` of Alpamayo 1 / 1.5, `build_conversation` of Alpamayo 2
Super) and its VQA prompt (`helper.create_vqa_message`), rendered by the checkpoint's chat template.

    system:    "You are a driving assistant that generates safe and accurate actions."
    user:      per camera in camera-index order: ["<camera name>: "] then per frame ["frame i "] <image>;
               <|traj_history_start|> 48 x <|traj_history|> <|traj_history_end|>
               [<|route_start|>route text<|route_end|>]      (Super: the raw route text, its own item)
               "output the chain-of-thought reasoning of the driving process, then output the future trajectory."
    assistant: "<|cot_start|>", continued (continue_final_message); Super: none, the prompt ends with the
               generation prompt `<|im_start|>assistant\n` and the model writes plain-text reasoning.

VQA: the same images, then `<|question_start|>question<|question_end|>` (no history), assistant
`<|answer_start|>` continued. Which labels precede the images is the family's (`PromptSettings.from_config`):
R1 none, 1.5 both whenever camera indices are known (as NVIDIA's helper, whatever the config flags say), Super
from its `include_camera_ids` / `frame_label`, the project's layouts from `include_camera_ids` /
`include_frame_nums`.

Each image renders as one `<|image_pad|>` (inside <|vision_start|>..<|vision_end|>); the VLM expands it to the
image's merged-patch count. The `<|traj_history|>` placeholders are replaced by the history bin tokens.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from alpamayo.errors import ConfigError
from alpamayo.families.vocabulary import marker
from alpamayo.json_fields import Fields
from alpamayo.tokenizer import chat_prompt_ids, qwen3vl_chat_template
from planner.checks import require_bins
from planner.settings import PlannerConfig
from planner.tokenizers import TrajectoryVocab

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
    """Which labels precede the images (Alpamayo 1.5 writes both, Alpamayo 1 neither), whether the assistant
    turn is prefilled with `<|cot_start|>` and whether route text goes inside route tokens (Super: neither)."""

    camera_labels: bool = True
    frame_labels: bool = True
    cot_prefill: bool = True
    route_tokens: bool = True

    @classmethod
    def from_config(cls, cfg: PlannerConfig) -> PromptSettings:
        """The family's policy (see the module docstring); "config" labels read `include_camera_ids` (default
        true) and `include_frame_nums` (default true) or, where the config has it, Super's `frame_label`."""
        family, extra = cfg.family, Fields(cfg.extra, "", cfg.source)
        camera = {"always": True, "never": False}.get(family.camera_labels)
        frame = {"always": True, "never": False}.get(family.frame_labels)
        if camera is None:
            camera = extra.bool("include_camera_ids", True)
        if frame is None and extra.has("frame_label"):
            label = extra.str("frame_label")
            if label not in ("frame_num", "none"):
                raise ConfigError(
                    f"{cfg.source}: field 'frame_label' = {label!r} is not supported; allowed: 'frame_num', 'none'"
                )
            frame = label == "frame_num"
        if frame is None:
            frame = extra.bool("include_frame_nums", True)
        return cls(camera, frame, family.cot_prefill, family.route_tokens)


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


def _image_items(cameras: Sequence[int], frames_per_camera: int, settings: PromptSettings) -> list[dict]:
    """One `{"type": "image"}` item per frame, cameras in index order, with the labels `settings` asks for."""
    content: list[dict[str, Any]] = []
    for camera in _check_cameras(cameras, frames_per_camera):
        if settings.camera_labels:
            content.append({"type": "text", "text": f"{camera_label(camera)}: "})
        for frame in range(frames_per_camera):
            if settings.frame_labels:
                content.append({"type": "text", "text": f"frame {frame} "})
            content.append({"type": "image"})
    return content


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def driving_messages(
    cameras: Sequence[int],
    frames_per_camera: int,
    num_history_tokens: int,
    route: str | None = None,
    settings: PromptSettings = PromptSettings(),
) -> list[dict[str, Any]]:
    """The chat messages of one driving prompt; images are `{"type": "image"}` items in camera-index order.
    Without `cot_prefill` there is no assistant message (render with add_generation_prompt)."""
    content = _image_items(cameras, frames_per_camera, settings)
    history = marker("traj_history") * num_history_tokens
    content.append(_text(marker("traj_history_start") + history + marker("traj_history_end")))
    if route is not None:
        content.append(
            _text(marker("route_start") + route + marker("route_end") if settings.route_tokens else route)
        )
    content.append(_text(INSTRUCTION))
    messages = [{"role": "system", "content": [_text(SYSTEM_PROMPT)]}, {"role": "user", "content": content}]
    if settings.cot_prefill:
        messages.append({"role": "assistant", "content": [_text(marker("cot_start"))]})
    return messages


def vqa_messages(
    cameras: Sequence[int], frames_per_camera: int, question: str, settings: PromptSettings = PromptSettings()
) -> list[dict[str, Any]]:
    """The chat messages of a question about the frames: images, `<|question_start|>q<|question_end|>`, and the
    assistant prefilled with `<|answer_start|>` (no history block), as NVIDIA's `create_vqa_message`."""
    content = _image_items(cameras, frames_per_camera, settings)
    content.append(_text(marker("question_start") + question + marker("question_end")))
    return [
        {"role": "system", "content": [_text(SYSTEM_PROMPT)]},
        {"role": "user", "content": content},
        {"role": "assistant", "content": [_text(marker("answer_start"))]},
    ]


def _check_plain_text(
    tokenizer: Any, added_tokens: Collection[str] | None, text: str, what: str = "route"
) -> None:
    """Route text and questions must be plain text: an added token inside (a marker, `<|image_pad|>`, `<i12>`)
    would change the prompt's structure. `added_tokens` None: looked up in `tokenizer`."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} must be non-empty text, got {text!r}")
    if added_tokens is None:
        added_tokens = tokenizer.get_added_vocab()
    inside = sorted({t for t in added_tokens if t in text})
    if inside:
        raise ValueError(f"{what} text {text!r} contains the reserved token(s) {inside}; pass plain text")


def _render(tokenizer: Any, messages: list[dict[str, Any]], continued: bool) -> np.ndarray:
    # Alpamayo takes its processor, chat template included, from Qwen3-VL's hub files, so its checkpoint's
    # tokenizer may have no template; Qwen3-VL's then renders the prompt.
    return np.array(
        chat_prompt_ids(
            tokenizer,
            messages,
            add_generation_prompt=not continued,
            continue_final_message=continued,
            fallback_template=qwen3vl_chat_template(),
        )
    )


def _checked_images(
    tokenizer: Any, ids: np.ndarray, cameras: Sequence[int], frames: int
) -> list[tuple[int, int]]:
    images = [(c, f) for c in sorted(cameras) for f in range(frames)]
    n_pads = int((ids == tokenizer.convert_tokens_to_ids(IMAGE_PAD)).sum())
    if n_pads != len(images):
        raise ValueError(f"the rendered prompt has {n_pads} {IMAGE_PAD} tokens for {len(images)} images")
    return images


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
        _check_plain_text(tokenizer, added_tokens, route)
    messages = driving_messages(cameras, frames_per_camera, len(history_bins), route, settings)
    ids = _render(tokenizer, messages, continued=settings.cot_prefill)
    slots = np.flatnonzero(ids == vocab.marker("traj_history"))
    if len(slots) != len(history_bins):
        raise ValueError(
            f"the rendered prompt has {len(slots)} {marker('traj_history')} placeholders for "
            f"{len(history_bins)} history tokens; the chat template must keep text items verbatim"
        )
    ids[slots] = vocab.history_ids[history_bins]
    images = _checked_images(tokenizer, ids, cameras, frames_per_camera)
    return DrivingPrompt(token_ids=ids.tolist(), images=images)


def build_vqa_prompt(
    tokenizer: Any,
    cameras: Sequence[int],
    frames_per_camera: int,
    question: str,
    settings: PromptSettings = PromptSettings(),
    added_tokens: Collection[str] | None = None,
) -> DrivingPrompt:
    """Render the VQA prompt (`vqa_messages`): token ids ending with `<|answer_start|>`, one pad per image."""
    _check_plain_text(tokenizer, added_tokens, question, "question")
    ids = _render(tokenizer, vqa_messages(cameras, frames_per_camera, question, settings), continued=True)
    return DrivingPrompt(
        token_ids=ids.tolist(), images=_checked_images(tokenizer, ids, cameras, frames_per_camera)
    )
