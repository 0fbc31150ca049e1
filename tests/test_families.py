"""Model families: tiny checkpoints laid out as NVIDIA ships Alpamayo R1, 1.5 and 2 Super load unchanged, with
each family's tokenizer, token order, prompt and defaults; their VLM decodes as transformers' does."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from alpamayo.checkpoint import INDEX_FILE, Checkpoint
from alpamayo.config.expert import parse_expert_config
from alpamayo.config.loader import load_model_config, model_tokenizer
from alpamayo.demo_checkpoint import QWEN_ADDED_TOKENS, base_tokenizer, hf_vlm
from alpamayo.demo_release import make_demo_checkpoint, write_base_model
from alpamayo.errors import CheckpointError, ConfigError
from alpamayo.families.registry import MARKERS_1_5, MARKERS_R1, TRAJ_MARKERS
from alpamayo.families.vocabulary import extend_tokenizer
from alpamayo.generation import Sampling
from alpamayo.model_spec import ModelSpec
from alpamayo.numerics import max_abs_error
from alpamayo.runtime import AlpamayoVLA, planner_config
from alpamayo.tokenizer import load_tokenizer
from alpamayo.vlm import VisionLanguageModel
from planner.tokenizers import TrajectoryVocab
from tests.hf_checkpoints import (
    hf_float_image_processor,
    hf_image_processor,
    hf_plan_tokens,
    nvidia_float_pixels,
)
from tests.test_runtime import frames_at, straight_history, write_prediction_inputs
from vision.preprocess import preprocess_images

RELEASES = ("r1", "alpamayo1.5", "super")
BASE_LEN = 538  # demo base vocabulary: 512 BPE tokens + the 26 Qwen added tokens (real: 151643 + 26)
SYSTEM = "You are a driving assistant that generates safe and accurate actions."
INSTRUCTION = (
    "output the chain-of-thought reasoning of the driving process, then output the future trajectory."
)
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
TRAJ = 16  # trajectory tokens compared with transformers' generate


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """One tiny checkpoint per release layout (R1 / 1.5 with their base model beside them)."""
    root = tmp_path_factory.mktemp("releases")
    return {layout: make_demo_checkpoint(root / layout, seed=0, layout=layout) for layout in RELEASES}


@pytest.fixture(scope="module")
def vla_of(releases):
    """layout -> its AlpamayoVLA, loaded once per module, so each encodes the test frames once (frame cache)."""
    loaded = {}

    def get(layout: str) -> AlpamayoVLA:
        if layout not in loaded:
            # The discrete decoder: these tests pin its tokens against transformers' generate (the layouts'
            # default, the action expert, is pinned by tests/test_expert_*.py).
            loaded[layout] = AlpamayoVLA.from_spec(
                ModelSpec(checkpoint=releases[layout], max_reasoning_tokens=4, decoder="tokens")
            )
        return loaded[layout]

    return get


def one_camera(tick: int = 3):
    """Camera 1's 4 frames (and times) of the runtime tests' scene: the smallest driving input."""
    frames, times = frames_at(tick)
    return {1: frames[1]}, {1: times[1]}


def weights_on_disk(directory) -> dict[str, torch.Tensor]:
    index = json.loads((directory / INDEX_FILE).read_text())["weight_map"]
    out = {}
    for shard in sorted(set(index.values())):
        out.update(load_file(str(directory / shard)))
    return out


@pytest.mark.parametrize("layout", RELEASES)
def test_released_layouts_are_detected_and_load(releases, layout):
    path = releases[layout]
    files = sorted(p.name for p in path.iterdir())
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    if layout == "super":
        shipped = ["chat_template.jinja", "config.json", "preprocessor_config.json", "tokenizer.json"]
        assert files == sorted([*shipped, "tokenizer_config.json", INDEX_FILE, *shards])
    else:  # no tokenizer, processor or generation files: the base model beside it has them
        assert files == sorted(["config.json", INDEX_FILE, *shards])
        raw = json.loads((path / "config.json").read_text())
        assert "vlm_config" not in raw and "text_config" not in raw
        assert raw["vlm_name_or_path"] == f"../{layout}-base"
        assert raw["traj_tokenizer_cfg"]["_target_"].endswith("DiscreteTrajectoryTokenizer")
    cfg = load_model_config(path)
    assert cfg.family_name == layout and cfg.weight_prefix == "vlm."
    tokenizer = model_tokenizer(cfg)
    if layout == "super":
        assert cfg.base_model is None and cfg.text.vocab_size == 4608  # 4566 tokens padded to 36 x 128
    else:
        assert cfg.base_model == str((path.parent / f"{layout}-base").resolve())
        assert cfg.text.vocab_size == len(tokenizer) == BASE_LEN + 4000 + 28
        assert cfg.eos_token_ids == tuple(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    vlm = VisionLanguageModel.from_checkpoint(path)
    assert (vlm.preprocess.min_pixels, vlm.preprocess.max_pixels) == (163840, 196608)


@pytest.mark.parametrize("layout", RELEASES)
def test_tensors_map_to_the_vlm_and_the_expert(releases, layout):
    """VLM tensors lose `vlm.` for the canonical names; the expert's keep their on-disk names, which are the
    ones the expert config (alpamayo.config.expert) expects, with its shapes."""
    path = releases[layout]
    cfg = load_model_config(path)
    ckpt = Checkpoint(path, cfg.weight_prefix)
    on_disk = weights_on_disk(path)
    vlm_keys = sorted(k.removeprefix("vlm.") for k in on_disk if k.startswith("vlm."))
    assert vlm_keys == sorted(hf_vlm_config_keys(path, cfg))
    assert ckpt.entry("lm_head.weight").key == "vlm.lm_head.weight"
    assert ckpt.shape("lm_head.weight") == (cfg.text.vocab_size, 128)
    assert ckpt.entry("language_model.layers.0.self_attn.q_proj.weight").key == (
        "vlm.model.language_model.layers.0.self_attn.q_proj.weight"
    )
    assert ckpt.entry("visual.blocks.0.attn.qkv.weight").key == "vlm.model.visual.blocks.0.attn.qkv.weight"
    raw = json.loads((path / "config.json").read_text())
    vlm_text = raw["vlm_config"]["text_config"] if layout == "super" else None
    if vlm_text is None:
        vlm_text = json.loads((path.parent / f"{layout}-base" / "config.json").read_text())["text_config"]
    expert = parse_expert_config(raw, vlm_text, str(path / "config.json"))
    shapes = expert.weight_shapes()
    extra = {k for k in on_disk if not k.startswith("vlm.")}
    prefix = "expert.expert." if layout == "super" else "expert."
    assert f"{prefix}layers.3.mlp.down_proj.weight" in shapes and f"{prefix}norm.weight" in shapes
    buffers = set()
    if layout == "r1":
        buffers = {f"action_space.{s}_{m}" for s in ("accel", "curvature") for m in ("mean", "std")}
        buffers |= set(expert.freqs_keys())
        assert torch.equal(on_disk["action_in_proj.sinus.0.freqs"], torch.logspace(0, 2, 10)[None])
    assert extra == set(shapes) | buffers
    for name, shape in shapes.items():
        assert ckpt.entry(name).shape == tuple(shape), name


def hf_vlm_config_keys(path, cfg) -> list[str]:
    """The state-dict keys of transformers' Qwen3-VL model for this checkpoint's VLM."""
    return list(hf_vlm(vlm_config_dict(path, cfg)).state_dict())


def vlm_config_dict(path, cfg) -> dict:
    """The checkpoint's Qwen3-VL config as NVIDIA builds it: nested (Super) or the base model's with the
    vocabulary of the extended tokenizer (R1 / 1.5)."""
    raw = json.loads((path / "config.json").read_text())
    if "vlm_config" in raw:
        return raw["vlm_config"]
    vlm = json.loads(
        (path.parent / f"{raw['vlm_name_or_path'].removeprefix('../')}" / "config.json").read_text()
    )
    vlm["text_config"]["vocab_size"] = len(model_tokenizer(cfg))
    return vlm


@pytest.mark.parametrize("layout", RELEASES)
def test_tokenizer_ids_follow_the_family_rule(releases, layout):
    cfg = load_model_config(releases[layout])
    tokenizer = model_tokenizer(cfg)
    ids = tokenizer.convert_tokens_to_ids
    assert ids("<i0>") == BASE_LEN and ids("<i3999>") == BASE_LEN + 3999
    vocab = TrajectoryVocab.from_tokenizer(tokenizer, None, cfg.text.vocab_size, cfg.family.history_first)
    if layout == "super":  # history <i0>..<i999>, future <i1000>..<i3999>
        assert vocab.history_ids.tolist() == list(range(BASE_LEN, BASE_LEN + 1000))
        assert vocab.future_ids.tolist() == list(range(BASE_LEN + 1000, BASE_LEN + 4000))
    else:  # future <i0>..<i2999>, history <i3000>..<i3999>
        assert vocab.future_ids.tolist() == list(range(BASE_LEN, BASE_LEN + 3000))
        assert vocab.history_ids.tolist() == list(range(BASE_LEN + 3000, BASE_LEN + 4000))
    markers = MARKERS_1_5 if layout == "alpamayo1.5" else MARKERS_R1
    new = [m for m in markers if m != "image_pad"]  # <|image_pad|> is a Qwen token already
    assert [ids(f"<|{m}|>") for m in new] == list(range(BASE_LEN + 4000, BASE_LEN + 4028))
    assert ids("<|traj_future_start|>") == BASE_LEN + 4012 and ids("<|image_pad|>") == 524
    assert ids("<|meta_action_start|>" if layout != "alpamayo1.5" else "<|_padding_2|>") == BASE_LEN + 4010


def test_the_real_vocabulary_gets_nvidias_ids():
    """The same construction on a base vocabulary of Qwen's real length and specials order (a stand-in of
    151643 byte-level entries: no package ships Qwen's BPE ranks offline without a heavy SDK) gives the
    released model's ids."""
    from tokenizers import pre_tokenizers
    from transformers import AddedToken, Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({f"w{i}": len(vocab) + i for i in range(151643 - len(vocab))})
    vocab.update({t: 151643 + i for i, (t, _) in enumerate(QWEN_ADDED_TOKENS)})
    tok = Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.add_tokens([AddedToken(t, special=s, normalized=not s) for t, s in QWEN_ADDED_TOKENS])
    assert len(tok) == 151669
    ids = extend_tokenizer(tok, 4000, MARKERS_1_5).convert_tokens_to_ids
    assert len(tok) == 155697
    assert (ids("<i0>"), ids("<i2999>"), ids("<i3000>"), ids("<i3999>")) == (151669, 154668, 154669, 155668)
    assert ids("<|traj_future_start|>") == 155681 and ids("<|image_pad|>") == 151655
    expected = {"prompt_start": 155669, "traj_history_start": 155674, "cot_start": 155677, "cot_end": 155678}
    expected |= {
        "traj_history": 155684,
        "route_start": 155690,
        "question_start": 155693,
        "answer_end": 155696,
    }
    assert {m: ids(f"<|{m}|>") for m in expected} == expected


def test_without_add_special_tokens_only_the_six_trajectory_markers_are_added():
    tok = extend_tokenizer(base_tokenizer(), 4000, MARKERS_1_5, add_special_tokens=False)
    assert len(tok) == BASE_LEN + 4000 + 6
    assert tok.convert_ids_to_tokens(list(range(BASE_LEN + 4000, BASE_LEN + 4006))) == [
        f"<|{m}|>" for m in TRAJ_MARKERS
    ]


def expected_prompt(tokenizer, vocab, images: str, bins, route: str, prefill: bool) -> list[int]:
    history = "<|traj_history|>" * len(bins)
    end = "<|im_start|>assistant\n<|cot_start|>" if prefill else "<|im_start|>assistant\n"
    text = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{images}"
        f"<|traj_history_start|>{history}<|traj_history_end|>{route}{INSTRUCTION}<|im_end|>\n{end}"
    )
    ids = np.array(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids[ids == tokenizer.convert_tokens_to_ids("<|traj_history|>")] = vocab.history_ids[bins]
    return ids.tolist()


@pytest.mark.parametrize("layout", RELEASES)
def test_prompt_token_sequence_is_pinned_per_family(releases, layout):
    """R1: no labels; 1.5: camera and frame labels although its config says false (NVIDIA's helper); Super:
    labels from its config, raw route text, no <|cot_start|> prefill, history bins from <i0>."""
    cfg = load_model_config(releases[layout])
    tokenizer = model_tokenizer(cfg)
    from planner.pipeline import Planner

    planner = Planner.from_config(planner_config(cfg), tokenizer)
    n_history = 45 if layout == "super" else 48
    bins = np.arange(n_history) * 20
    from planner.prompt import build_prompt

    prompt = build_prompt(
        tokenizer, planner.vocab, [6, 1], 2, bins, "Turn left in 11m", planner.prompt_settings
    )
    labelled = (
        f"Front camera: frame 0 {IMAGE}frame 1 {IMAGE}Front telephoto camera: frame 0 {IMAGE}frame 1 {IMAGE}"
    )
    if layout == "r1":
        images, route, prefill = IMAGE * 4, "<|route_start|>Turn left in 11m<|route_end|>", True
    elif layout == "alpamayo1.5":
        images, route, prefill = labelled, "<|route_start|>Turn left in 11m<|route_end|>", True
    else:
        images, route, prefill = labelled, "Turn left in 11m", False
    assert prompt.token_ids == expected_prompt(tokenizer, planner.vocab, images, bins, route, prefill)
    start = prompt.token_ids.index(tokenizer.convert_tokens_to_ids("<|traj_history_start|>"))
    first = 0 if layout == "super" else 3000
    block = tokenizer.convert_ids_to_tokens(prompt.token_ids[start + 1 : start + 1 + n_history])
    assert block == [f"<i{first + b}>" for b in bins]


def test_vqa_prompt_prefills_the_answer_without_history(releases):
    cfg = load_model_config(releases["alpamayo1.5"])
    tokenizer = model_tokenizer(cfg)
    from planner.pipeline import Planner

    prompt = Planner.from_config(planner_config(cfg), tokenizer).vqa_prompt([1], 1, "Is the light green?")
    text = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nFront camera: frame 0 {IMAGE}"
        "<|question_start|>Is the light green?<|question_end|><|im_end|>\n<|im_start|>assistant\n<|answer_start|>"
    )
    assert prompt.token_ids == tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("layout", RELEASES)
def test_greedy_tokens_equal_transformers_on_the_same_weights(releases, vla_of, layout, record_figure):
    """The whole family path (prompt, token order, constrained decoding) against transformers'
    Qwen3VLForConditionalGeneration holding the checkpoint's `vlm.*` tensors."""
    path, vla = releases[layout], vla_of(layout)
    frames, times = one_camera()
    (sample,) = vla.predict(frames, straight_history(), frame_times_ns=times, sampling=Sampling()).samples
    planner, cfg = vla.planner, vla.vlm.config
    prompt = planner.prompt([1], 4, planner.history(straight_history()))
    images = [frames[c][i] for c, i in prompt.images]
    if layout == "super":  # NVIDIA's Super helper: float images / 255, do_rescale=False (torchvision)
        pixels, grid = nvidia_float_pixels(hf_float_image_processor(163840, 196608), images)
        vision = {"pixel_values": pixels, "image_grid_thw": grid}
    else:
        vision = hf_image_processor(163840, 196608)(images=images, return_tensors="pt")
    ids = vla.vlm.expand_image_pads(prompt.token_ids, vla._features(frames, times, prompt.images))
    ids = torch.tensor(ids)
    hf = hf_vlm(vlm_config_dict(path, cfg))
    weights = weights_on_disk(path)
    hf.load_state_dict(
        {k.removeprefix("vlm."): v for k, v in weights.items() if k.startswith("vlm.")}, strict=True
    )
    # transformers decodes the reasoning and the first TRAJ trajectory tokens (its generate costs ~0.2 s a
    # token on this busy CPU); ours decodes all 128.
    out = hf_plan_tokens(hf, ids, vision, cfg, planner.vocab, 4, 4 + 1 + TRAJ)
    start = out.index(planner.vocab.marker("traj_future_start"))
    assert sample.reasoning_token_ids == out[:start]
    assert sample.token_ids[:TRAJ] == out[start + 1 : start + 1 + TRAJ]
    assert sample.xyz.shape == (64, 3) and np.isfinite(sample.xyz).all()
    record_figure("greedy tokens equal to transformers", len(out))


@pytest.mark.parametrize("layout", RELEASES)
def test_image_path_follows_the_family(releases, vla_of, layout):
    """Super's processor resizes float images x / 255 (its helper's `do_rescale=False`): its features are the
    torchvision processor's pixels through the vision tower; R1 and 1.5 keep the uint8 path."""
    vlm = vla_of(layout).vlm
    assert vlm.preprocess.float_input == (layout == "super")
    frames, _ = one_camera()
    images = frames[1][:2]
    if layout == "super":
        expected, grid = nvidia_float_pixels(hf_float_image_processor(163840, 196608), images)
    else:
        out = hf_image_processor(163840, 196608)(images=images, return_tensors="pt")
        expected, grid = out["pixel_values"], out["image_grid_thw"]
    pixels, ours_grid = preprocess_images(images, vlm.preprocess)
    assert torch.equal(ours_grid, grid)
    # the float path is transformers' bit for bit; the uint8 path within one level (`vision.resize`)
    assert max_abs_error(expected, pixels) <= (0.0 if layout == "super" else 2 / 255 + 1e-6)


@pytest.mark.parametrize("layout", RELEASES)
def test_release_families_sample_as_nvidia_by_default(releases, layout):
    default = load_model_config(releases[layout]).family.sampling
    assert default == Sampling(temperature=0.6, top_p=0.98, top_k=None)
    assert default.override(temperature=0).greedy and default.override(top_k=5).top_k == 5


def test_seeded_sampling_with_the_family_defaults_reproduces_exactly(vla_of):
    """No sampling given: the family's (0.6 / 0.98); the same seed, the same sample (test_runtime pins that K
    samples are K independent streams)."""
    vla = vla_of("alpamayo1.5")
    assert vla.sampling == Sampling(0.6, 0.98) and vla.family.name == "alpamayo1.5"
    frames, times = one_camera()
    a, b = (vla.predict(frames, straight_history(), seed=7, frame_times_ns=times).best for _ in range(2))
    assert a.reasoning_token_ids == b.reasoning_token_ids and a.token_ids == b.token_ids


def test_top_k_then_top_p_filter_as_transformers_does():
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from alpamayo.generation import nucleus_logits

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    for k, p in ((5, 1.0), (5, 0.6), (1, 0.98), (50, 0.98)):
        expected = TemperatureLogitsWarper(0.6)(None, logits.clone())
        expected = TopPLogitsWarper(p)(None, TopKLogitsWarper(k)(None, expected))
        torch.testing.assert_close(nucleus_logits(logits, 0.6, p, k), expected, rtol=0, atol=0)


def test_ask_answers_up_to_answer_end_and_r1_refuses(releases, vla_of):
    vla = vla_of("super")
    frames, times = one_camera()
    answer = vla.ask(frames, "Is the road clear?", seed=1, frame_times_ns=times, max_new_tokens=5)
    assert len(answer.token_ids) == 5 and answer.capped and answer.timings_ms["answer_decode"] > 0
    assert answer.text == vla.planner.answer_text(answer.token_ids)
    again = vla.ask(frames, "Is the road clear?", seed=1, frame_times_ns=times, max_new_tokens=5)
    assert again.token_ids == answer.token_ids
    with pytest.raises(ValueError, match="contains the reserved token"):
        vla.ask(frames, "why <|cot_start|>?", frame_times_ns=times)
    r1 = AlpamayoVLA.__new__(AlpamayoVLA)
    r1.vlm = VisionLanguageModel.__new__(VisionLanguageModel)
    r1.vlm.config = load_model_config(releases["r1"])
    with pytest.raises(ValueError, match=r"Alpamayo 1 \(R1\) checkpoints do not answer questions"):
        r1.ask(frames, "Is the road clear?")


def moved_away(release, to) -> str:
    """Copy the release checkpoint `release` to `to`, away from the base model beside it that its
    `vlm_name_or_path` names; returns that base model's directory, for `--base-model`."""
    shutil.copytree(release, to)
    return str(release.parent / f"{release.name}-base")


def test_predict_and_ask_commands_with_base_model_print_the_family(releases, tmp_path, capsys):
    from alpamayo.cli import main

    moved = tmp_path / "ckpt"
    base = moved_away(releases["alpamayo1.5"], moved)  # its ../alpamayo1.5-base is not beside it there
    write_prediction_inputs(tmp_path, *one_camera(), straight_history())
    args = [
        "predict",
        "--checkpoint",
        str(moved),
        "--frames",
        str(tmp_path / "frames"),
        "--ego",
        str(tmp_path / "ego.csv"),
    ]
    args += ["--max-reasoning-tokens", "3", "--seed", "0"]
    assert main(args) == 2
    assert "base model 'vlm_name_or_path' = '../alpamayo1.5-base' not found" in capsys.readouterr().err
    assert main([*args, "--base-model", base]) == 0
    text = capsys.readouterr().out
    assert (
        "model family: Alpamayo 1.5 (alpamayo1.5); decoding: temperature 0.6, top_p 0.98, top_k all" in text
    )
    assert text.count("\n") > 64 and "sample 0: reasoning (3 tokens, length cap reached)" in text
    ask = ["ask", "--checkpoint", str(moved), "--base-model", base, "--frames", str(tmp_path / "frames")]
    assert (
        main([*ask, "--question", "Is it raining?", "--max-new-tokens", "2", "--temperature", "0", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["family"] == "alpamayo1.5" and len(out["token_ids"]) == 2


def test_replay_prints_the_family_first(releases, tmp_path, capsys):
    from alpamayo.cli import main
    from alpamayo.demo_drive import make_demo_drive

    base = moved_away(releases["alpamayo1.5"], tmp_path / "ckpt")
    drive = make_demo_drive(tmp_path / "drive.mcap", 1.7, 1, 5, (72, 128)).path
    args = ["replay", str(drive), "--checkpoint", str(tmp_path / "ckpt"), "--base-model", base]
    args += ["--out", str(tmp_path / "out.mcap"), "--max-ticks", "1", "--max-reasoning-tokens", "2"]
    args += ["--no-progress", "--decoder", "tokens"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(
        "model family: Alpamayo 1.5 (alpamayo1.5); decoding: temperature 0.6, top_p 0.98, top_k all; "
        "trajectory decoder: trajectory tokens\n"
    )
    assert "Latency per stage (ms) over 1 measured ticks" in captured.out


def test_serve_prints_the_family_at_start_up(releases, tmp_path):
    import signal

    from tests.test_bridge_serve import start_serve_logged, stop

    base = moved_away(releases["r1"], tmp_path / "ckpt")
    serve, _, startup = start_serve_logged(
        "--checkpoint", str(tmp_path / "ckpt"), "--base-model", base, "--set", "warmup.runs=0"
    )
    try:
        assert (
            "model family: Alpamayo 1 (R1) (r1); decoding: temperature 0.6, top_p 0.98, top_k all" in startup
        )
        assert startup.index("loading model from") < startup.index("model family:")
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(10) == 0
    finally:
        stop(serve)


MODEL_COMMANDS = ("generate", "predict", "ask", "replay", "profile", "serve", "plan", "eval", "precision")


def test_every_command_that_loads_a_model_takes_base_model():
    """`demo` is not among them: it loads only the checkpoint it writes, with its base model beside it."""
    from alpamayo.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    missing = [c for c in MODEL_COMMANDS if "--base-model" not in commands[c]._option_string_actions]
    assert missing == []


# ------------------------------------------------------------------ base-model resolution


def hub_cache(root, repo: str, files_from) -> None:
    """A Hugging Face cache (`HF_HUB_CACHE` layout) holding `files_from`'s files as one snapshot of `repo`."""
    snapshot = root / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
    shutil.copytree(files_from, snapshot)
    (root / f"models--{repo.replace('/', '--')}" / "refs").mkdir()
    (root / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text("0" * 40)


def with_base_name(src, dst, name: str, drop: tuple[str, ...] = ()):
    """A copy of checkpoint `src` whose `vlm_name_or_path` is `name`, without the config keys `drop`."""
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    raw = {k: v for k, v in raw.items() if k not in drop}
    (dst / "config.json").write_text(json.dumps(dict(raw, vlm_name_or_path=name)))
    return dst


def test_base_model_from_an_absolute_directory_and_from_the_hf_cache(releases, tmp_path, monkeypatch):
    base = releases["alpamayo1.5"].parent / "alpamayo1.5-base"
    absolute = with_base_name(releases["alpamayo1.5"], tmp_path / "abs", str(base))
    assert load_model_config(absolute).base_model == str(base.resolve())
    cached = with_base_name(releases["alpamayo1.5"], tmp_path / "hub", "acme/tiny-qwen3-vl")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    hub_cache(tmp_path / "cache", "acme/tiny-qwen3-vl", base)
    cfg = load_model_config(cached)
    assert cfg.base_model.endswith("snapshots/" + "0" * 40) and cfg.text.hidden_size == 128


def test_a_known_8b_base_with_only_a_tokenizer_takes_the_bundled_config(releases, tmp_path, monkeypatch):
    tokenizer_only = tmp_path / "tok"
    shutil.copytree(releases["r1"].parent / "r1-base", tokenizer_only)
    (tokenizer_only / "config.json").unlink()
    # without its toy expert, which cannot share an 8B VLM's cache
    no_expert = ("expert_cfg", "action_in_proj_cfg")
    ckpt = with_base_name(releases["r1"], tmp_path / "r1", "nvidia/Cosmos-Reason2-8B", no_expert)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    hub_cache(tmp_path / "cache", "nvidia/Cosmos-Reason2-8B", tokenizer_only)
    cfg = load_model_config(ckpt)
    assert (cfg.text.hidden_size, cfg.text.num_hidden_layers, cfg.vision.depth) == (4096, 36, 27)
    assert cfg.text.vocab_size == BASE_LEN + 4028  # the tokenizer's length, as NVIDIA's config sets it
    other = with_base_name(releases["r1"], tmp_path / "other", str(tokenizer_only), no_expert)
    with pytest.raises(ConfigError, match=r"has no config.json; only the known 8B bases"):
        load_model_config(other)


# ------------------------------------------------------------------ errors, all before any weight is read


@pytest.fixture
def no_weight_reads(monkeypatch):
    def refuse(self, name, *args, **kwargs):
        raise AssertionError(f"weight '{name}' was read before the error")

    monkeypatch.setattr(Checkpoint, "get", refuse)


def test_an_unknown_family_names_the_file_and_the_known_ones(tmp_path, no_weight_reads):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Alpamayo3Ultra"], "model_type": "x"})
    )
    with pytest.raises(
        ConfigError,
        match=r"config.json: unsupported architecture \['Alpamayo3Ultra'\] .*"
        r"the Alpamayo releases \['AlpamayoR1', 'Alpamayo1_5', 'Alpamayo2Super'\]",
    ):
        VisionLanguageModel.from_checkpoint(tmp_path)


def test_a_missing_base_model_names_the_id_and_the_three_ways(
    releases, tmp_path, monkeypatch, no_weight_reads
):
    ckpt = with_base_name(releases["r1"], tmp_path / "r1", "nvidia/Cosmos-Reason2-8B")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ConfigError) as e:
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=ckpt))
    message = str(e.value)
    assert "config.json: base model 'vlm_name_or_path' = 'nvidia/Cosmos-Reason2-8B' not found" in message
    assert f"(a) a local directory 'nvidia/Cosmos-Reason2-8B', absolute or relative to {ckpt}" in message
    assert f"(b) the model in the local Hugging Face cache ({tmp_path / 'empty-cache'}" in message
    assert "(c) --base-model DIR" in message and "model.base_model in the node YAML" in message
    with pytest.raises(ConfigError, match=r"--base-model /nonexistent: no such directory"):
        load_model_config(ckpt, "/nonexistent")
    with pytest.raises(ConfigError, match=r"is a Alpamayo 2 Super checkpoint, which needs no base model"):
        load_model_config(releases["super"], str(tmp_path))


def test_a_vocabulary_that_does_not_match_the_embeddings_names_both(releases, tmp_path, no_weight_reads):
    base = tmp_path / "base"
    tokenizer = write_base_model(base)
    tokenizer.add_tokens(["<|extra|>"], special_tokens=True)  # a different base model: one token more
    tokenizer.save_pretrained(base)
    n = BASE_LEN + 4028
    saved = with_base_name(releases["alpamayo1.5"], tmp_path / "saved", str(base))
    with pytest.raises(
        ConfigError,
        match=rf"field 'vocab_size' = {n}, but the tokenizer of base model {base}, extended, gives {n + 1}",
    ):
        load_model_config(saved)
    derived = ("vocab_size", "traj_token_start_idx")  # what NVIDIA's config saves beside its own fields
    ckpt = with_base_name(releases["alpamayo1.5"], tmp_path / "ckpt", str(base), derived)
    with pytest.raises(
        CheckpointError,
        match=rf"model-00001-of-00003.safetensors: tensor 'vlm.model.language_model.embed_tokens.weight' has {n} "
        rf"rows but the tokenizer \(base model {base}, extended\) has {n + 1} tokens; they must equal",
    ):
        VisionLanguageModel.from_checkpoint(ckpt)


def with_plain_tokenizer(source, ckpt):
    """A copy of the Super checkpoint `source` whose tokenizer is the base Qwen one, without the `<iN>` and the
    Alpamayo markers (as a checkpoint re-saved from the base model's processor would ship it)."""
    shutil.copytree(source, ckpt)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (ckpt / name).unlink()
    base_tokenizer().save_pretrained(ckpt)
    return ckpt


def test_a_super_checkpoint_with_a_plain_tokenizer_is_completed_at_load(releases, tmp_path, capsys):
    """NVIDIA's `build_alpamayo2_super_tokenizer` adds the `<iN>` and the markers to the checkpoint's tokenizer
    at every load: a plain one gets the shipped extended tokenizer's ids, and the load says so once."""
    ckpt = with_plain_tokenizer(releases["super"], tmp_path / "plain")
    assert "<i0>" not in load_tokenizer(ckpt).get_vocab()
    capsys.readouterr()
    vla = AlpamayoVLA.from_spec(ModelSpec(checkpoint=ckpt, decoder="tokens", max_reasoning_tokens=2))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert f"{ckpt}: the tokenizer lacks 4028 of Alpamayo 2 Super's trajectory tokens and markers" in lines[0]
    assert "added at load as NVIDIA's code adds them (<i0>..<i3999>, then the markers)" in lines[0]
    completed = model_tokenizer(vla.vlm.config)
    shipped = model_tokenizer(load_model_config(releases["super"]))
    assert completed.get_vocab() == shipped.get_vocab() and len(completed) == BASE_LEN + 4028
    assert completed.convert_tokens_to_ids("<|traj_future_start|>") == BASE_LEN + 4012
    # the whole driving prompt (history bins, markers, route text) is the same token sequence
    shipped_planner = AlpamayoVLA.from_spec(ModelSpec(checkpoint=releases["super"], decoder="tokens")).planner
    bins = vla.planner.history(straight_history())
    prompt = vla.planner.prompt([1, 6], 4, bins, "Turn left in 11m").token_ids
    assert prompt == shipped_planner.prompt([1, 6], 4, bins, "Turn left in 11m").token_ids
    # a shipped complete tokenizer is taken as it is, silently
    capsys.readouterr()
    assert model_tokenizer(load_model_config(releases["super"])) is shipped
    assert capsys.readouterr().err == ""


def test_super_reasoning_masks_what_nvidias_logits_processors_mask(releases, tmp_path):
    """NVIDIA's reasoning: `MaskDiscreteTrajectoryLogitsProcessor` over [min(history_id0, future_id0), + 4000)
    of config.json's `traj_ids`, `MaskTokenIdsLogitsProcessor` over the nested VLM's generation-config EOS ids
    (`GenerationConfig.from_model_config(vlm_config)`: a generation_config.json beside it is never read) except
    `<|traj_future_start|>`; the padding rows of the vocabulary stay open."""
    from transformers import GenerationConfig, Qwen3VLConfig

    from alpamayo.decoding.loop import _Masks
    from planner.pipeline import Planner

    ckpt = tmp_path / "super"
    shutil.copytree(releases["super"], ckpt)
    raw = json.loads((ckpt / "config.json").read_text())
    start = raw["traj_ids"]["future_start"]
    raw["vlm_config"]["eos_token_id"] = [raw["vlm_config"]["text_config"]["eos_token_id"], start]
    (ckpt / "config.json").write_text(json.dumps(raw))
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))  # not NVIDIA's source
    cfg = load_model_config(ckpt)
    fields = {k: v for k, v in raw["vlm_config"].items() if k not in ("architectures", "model_type")}
    nvidia_eos = GenerationConfig.from_model_config(Qwen3VLConfig(**fields)).eos_token_id
    assert list(cfg.eos_token_ids) == nvidia_eos
    vocab = Planner.from_config(planner_config(cfg), model_tokenizer(cfg)).vocab
    bias = _Masks(vocab, cfg.text.vocab_size, cfg.eos_token_ids, torch.device("cpu")).reasoning
    expected = torch.zeros(cfg.text.vocab_size)
    first = min(raw["traj_ids"]["history_id0"], raw["traj_ids"]["future_id0"])
    expected[first : first + raw["traj_vocab_size"]] = float("-inf")
    expected[[e for e in nvidia_eos if e != start]] = float("-inf")
    assert torch.equal(bias, expected)
    assert bias[start] == 0 and not bias[len(model_tokenizer(cfg)) :].any()  # padding rows 4566..4607 open


def test_physicalai_av_clips_open_the_familys_driving_cameras(releases, tmp_path):
    """Replay and eval open a PhysicalAI-AV clip with the family's driving cameras unless --cameras picks
    them: Super's trajectory task shows six (NVIDIA's `DRIVING_SIX_CAMERA_FOUR_FRAME`), R1 / 1.5 four."""
    from alpamayo.replay.session import pai_cameras
    from alpamayo.replay.settings import ReplaySettings

    expected = {"super": (0, 1, 2, 3, 5, 6), "alpamayo1.5": (0, 1, 2, 6), "r1": (0, 1, 2, 6)}
    for layout, cameras in expected.items():
        assert pai_cameras(ReplaySettings(drive="pai:clip@100", model=ModelSpec(releases[layout]))) == cameras
    chosen = ReplaySettings(drive="pai:clip@100", model=ModelSpec(releases["super"]), cameras=(1, 6))
    assert pai_cameras(chosen) == (1, 6)
    assert (
        pai_cameras(ReplaySettings(drive=tmp_path / "drive.mcap", model=ModelSpec(releases["super"]))) is None
    )


def test_a_super_tokenizer_that_disagrees_with_the_saved_traj_ids_is_refused(releases, tmp_path):
    ckpt = tmp_path / "other"
    shutil.copytree(releases["super"], ckpt)
    raw = json.loads((ckpt / "config.json").read_text())
    raw["traj_ids"]["future_start"] += 1
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(
        ConfigError,
        match=rf"config.json: field 'traj_ids.future_start' = {BASE_LEN + 4013}, but the checkpoint's tokenizer "
        rf"gives <\|traj_future_start\|> id {BASE_LEN + 4012}; the tokenizer is not the one",
    ):
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=ckpt, decoder="tokens"))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_hidden_layers": 3}, r"the action expert has 3 layers but the VLM has 4"),
        (
            {"num_key_value_heads": 1},
            r"the action expert's KV width 32 \(num_key_value_heads 1 x head_dim 32\) "
            r"differs from the VLM's 64 \(2 x 32\)",
        ),
    ],
)
def test_an_expert_that_cannot_share_the_vlm_cache_is_refused(
    releases, tmp_path, change, message, no_weight_reads
):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(releases["alpamayo1.5"], ckpt)
    raw = json.loads((ckpt / "config.json").read_text())
    raw["vlm_name_or_path"] = str(releases["alpamayo1.5"].parent / "alpamayo1.5-base")
    raw["expert_cfg"].update(change)
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=rf"{ckpt / 'config.json'}: {message}"):
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=ckpt))


def test_a_missing_shard_and_a_truncated_one_name_file_and_tensor(releases, tmp_path, no_weight_reads):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(releases["super"], ckpt)
    shard = ckpt / "model-00002-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(
        CheckpointError, match=rf"{shard}: truncated safetensors file: tensor '.+' ends at data byte"
    ):
        VisionLanguageModel.from_checkpoint(ckpt)
    shard.unlink()
    with pytest.raises(
        CheckpointError,
        match=rf"{INDEX_FILE}: tensor '.+' is mapped to shard 'model-00002-of-00003.safetensors', "
        "which does not exist",
    ):
        VisionLanguageModel.from_checkpoint(ckpt)


def test_plan_prints_the_family_and_the_node_yaml_takes_a_base_model(releases, capsys):
    from alpamayo.cli import main
    from bridges.node.config import load_node_config

    assert main(["plan", "--checkpoint", str(releases["r1"])]) == 0
    assert "model family: Alpamayo 1 (R1) (r1)" in capsys.readouterr().out
    config = load_node_config(None, [("model.base_model", "/b"), ("model.top_k", 5)])
    assert (config.model.base_model, config.model.temperature, config.model.top_k) == ("/b", None, 5)
    assert main(["serve", "--base-model", "/b", "--print-config"]) == 0
    assert "base_model: /b" in capsys.readouterr().out


@pytest.mark.parametrize("layout, expected", [("alpamayo1.5", "Slow down"), ("super", "Slow downthen go")])
def test_reasoning_text_follows_the_family(releases, layout, expected):
    """1.5: the text up to <|cot_end|>; Super: all of the plain assistant text before <|traj_future_start|>
    (specials dropped: its <|cot_end|> is not an end marker there, only text)."""
    from planner.pipeline import Planner

    cfg = load_model_config(releases[layout])
    tokenizer = model_tokenizer(cfg)
    planner = Planner.from_config(planner_config(cfg), tokenizer)
    ids = tokenizer("Slow down<|cot_end|>then go", add_special_tokens=False)["input_ids"]
    assert planner.reasoning_text(ids) == expected
