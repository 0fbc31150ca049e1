"""The Alpamayo driving prompt rendered by the demo checkpoint's chat template and tokenizer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from alpamayo.config.loader import load_model_config
from alpamayo.errors import ConfigError
from alpamayo.runtime import planner_config
from alpamayo.tokenizer import load_tokenizer
from planner.prompt import PromptSettings, build_prompt
from planner.tokenizers import TrajectoryVocab

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
SYSTEM = "You are a driving assistant that generates safe and accurate actions."
INSTRUCTION = (
    "output the chain-of-thought reasoning of the driving process, then output the future trajectory."
)


@pytest.fixture(scope="module")
def tokenizer(demo_checkpoint):
    return load_tokenizer(demo_checkpoint)


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return TrajectoryVocab.from_tokenizer(tokenizer)


def expected_ids(tokenizer, vocab, user_images: str, history_bins, route: str = "") -> list[int]:
    """The Alpamayo 1.5 prompt written out as text, tokenized, with the history placeholders substituted."""
    history = "<|traj_history|>" * len(history_bins)
    text = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user_images}"
        f"<|traj_history_start|>{history}<|traj_history_end|>{route}{INSTRUCTION}<|im_end|>\n"
        "<|im_start|>assistant\n<|cot_start|>"
    )
    ids = np.array(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids[ids == tokenizer.convert_tokens_to_ids("<|traj_history|>")] = vocab.history_ids[history_bins]
    return ids.tolist()


def test_exact_token_sequence_for_two_cameras_with_route(tokenizer, vocab):
    bins = np.arange(0, 960, 20)  # 48 distinct history bins
    prompt = build_prompt(tokenizer, vocab, [6, 1], 2, bins, route="Turn left in 11m")
    images = (
        f"Front camera: frame 0 {IMAGE}frame 1 {IMAGE}Front telephoto camera: frame 0 {IMAGE}frame 1 {IMAGE}"
    )
    route = "<|route_start|>Turn left in 11m<|route_end|>"
    assert prompt.token_ids == expected_ids(tokenizer, vocab, images, bins, route)
    assert prompt.images == [(1, 0), (1, 1), (6, 0), (6, 1)]
    # the history block, token by token: <|traj_history_start|>, <i3000>, <i3020>, ..., <|traj_history_end|>
    start = prompt.token_ids.index(vocab.marker("traj_history_start"))
    block = tokenizer.convert_ids_to_tokens(prompt.token_ids[start : start + 50])
    assert block == ["<|traj_history_start|>"] + [f"<i{3000 + b}>" for b in bins] + ["<|traj_history_end|>"]
    assert tokenizer.convert_ids_to_tokens(prompt.token_ids[-1]) == "<|cot_start|>"


def test_four_cameras_by_four_frames_give_sixteen_image_placeholders(tokenizer, vocab):
    prompt = build_prompt(tokenizer, vocab, [2, 0, 6, 1], 4, np.full(48, 500))
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert prompt.token_ids.count(pad) == 16
    assert [c for c, _ in prompt.images] == [0] * 4 + [1] * 4 + [2] * 4 + [6] * 4
    text = tokenizer.decode(prompt.token_ids)
    labels = ["Front left camera: ", "Front camera: ", "Front right camera: ", "Front telephoto camera: "]
    assert [text.index(label) for label in labels] == sorted(text.index(label) for label in labels)


def test_alpamayo_1_format_has_no_labels_and_45_history_tokens(tokenizer, vocab):
    bins = np.arange(45)
    prompt = build_prompt(tokenizer, vocab, [1], 3, bins, settings=PromptSettings(False, False))
    assert prompt.token_ids == expected_ids(tokenizer, vocab, IMAGE * 3, bins)


def test_a_tokenizer_without_a_chat_template_renders_with_qwen3vl_s(demo_checkpoint, vocab):
    """Alpamayo checkpoints take their chat template from Qwen3-VL's hub processor, so theirs may have none."""
    bare = load_tokenizer(demo_checkpoint)
    bare.chat_template = None
    bins = np.arange(48)
    prompt = build_prompt(bare, vocab, [1], 1, bins, route="Turn right")
    route = "<|route_start|>Turn right<|route_end|>"
    assert prompt.token_ids == expected_ids(bare, vocab, f"Front camera: frame 0 {IMAGE}", bins, route)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(route="go <|route_end|> now"), r"contains the reserved token\(s\) \['<\|route_end\|>'\]"),
        (dict(route="  "), r"route must be non-empty text"),
        (dict(cameras=[1, 1]), r"camera indices must be distinct, got \[1, 1\]"),
        (dict(cameras=[]), r"cameras must be a non-empty list"),
        (dict(frames=0), r"frames_per_camera must be an integer >= 1, got 0"),
        (dict(bins=np.array([0, 1000])), r"history_bins\[1\] = 1000 is outside the bin range \[0, 999\]"),
    ],
)
def test_bad_prompt_inputs_are_rejected(tokenizer, vocab, kwargs, message):
    args = dict(cameras=[1], frames=4, bins=np.zeros(48, dtype=np.int64), route=None) | kwargs
    with pytest.raises(ValueError, match=message):
        build_prompt(tokenizer, vocab, args["cameras"], args["frames"], args["bins"], args["route"])


def test_label_settings_come_from_config_json(demo_checkpoint):
    cfg = load_model_config(demo_checkpoint)
    assert PromptSettings.from_config(planner_config(cfg)) == PromptSettings(
        camera_labels=True, frame_labels=True
    )
    no_frames = dataclasses.replace(cfg, extra=dict(cfg.extra, include_frame_nums=False))
    assert PromptSettings.from_config(planner_config(no_frames)) == PromptSettings(
        camera_labels=True, frame_labels=False
    )
    bad = dataclasses.replace(cfg, extra=dict(cfg.extra, include_camera_ids="yes"))
    with pytest.raises(
        ConfigError, match=r"config.json: field 'include_camera_ids' must be true or false, got 'yes'"
    ):
        PromptSettings.from_config(planner_config(bad))
