"""Images + text end to end against transformers' Qwen3VLForConditionalGeneration on a saved random checkpoint.

The checkpoint randomises every weight; its vision tower has a 6x6 learned position grid (no test image has
that patch grid) and DeepStack after blocks 1, 2 and 4 of 5 (uneven, the last included), feeding decoder
layers 0..2 of 4. transformers' side runs its own image processor and chat template.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from alpamayo.backends import BackendOptions
from alpamayo.errors import ConfigError
from alpamayo.generation import greedy_continue
from alpamayo.numerics import max_abs_error, pcc
from alpamayo.positions import expand_image_pads, mrope_position_ids
from alpamayo.vlm import VisionLanguageModel
from tests.hf_checkpoints import (
    SMALL_VISION,
    TOKEN_IDS,
    build_tokenizer,
    hf_greedy,
    hf_image_processor,
    hf_multimodal_inputs,
    load_hf,
    save_checkpoint,
    save_preprocessor_config,
    text_config,
)
from tests.images import synthetic_frame
from vision.encoder import VisionEncoder

# 5 blocks with DeepStack after blocks 1, 2 and 4 (uneven, the last included); a 6x6 learned position grid
VISION = dict(SMALL_VISION, depth=5, hidden_size=64, intermediate_size=96, num_heads=4)
VISION |= {"num_position_embeddings": 36, "deepstack_visual_indexes": [1, 2, 4]}
TEXT = text_config(
    num_hidden_layers=4,
    head_dim=32,
    rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [6, 5, 5]},
)
PIXELS = dict(min_pixels=32 * 32, max_pixels=1 << 20)  # every test image is already a multiple of 32 inside
ALPAMAYO_PIXELS = dict(min_pixels=163840, max_pixels=196608)  # Alpamayo's config.json: 1080x1920 -> 320x576
PROMPT = "Describe the scene."
NEW_TOKENS = 32
# image sizes (height, width): the 16-image case is Alpamayo's 4 cameras x 4 frames at reduced resolution
CASES = {
    "1-image": [(96, 160)],
    "2-images-of-different-sizes": [(64, 128), (160, 96)],
    "16-images": [(96, 160)] * 16,
}
IMAGE_PAD = TOKEN_IDS["<|image_pad|>"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("vlm")
    hf = save_checkpoint(path, TEXT, vision=VISION, seed=31)
    save_preprocessor_config(path, **PIXELS)
    return path, hf


@pytest.fixture(scope="module")
def vlm(checkpoint):
    return VisionLanguageModel.from_checkpoint(checkpoint[0])


@pytest.fixture(scope="module")
def vlm_bf16(checkpoint):
    return VisionLanguageModel.from_checkpoint(checkpoint[0], BackendOptions(dtype=torch.bfloat16))


@pytest.fixture(scope="module")
def hf_bf16(checkpoint):
    return load_hf(checkpoint[0], torch.bfloat16)


class Case(dict):
    def __repr__(self) -> str:
        return f"Case({self['name']})"


def hf_outputs(hf: torch.nn.Module, inputs: dict, pixel_dtype: torch.dtype = torch.float32) -> dict:
    ids, grid = inputs["ids"], inputs["image_grid_thw"]
    kwargs = dict(
        pixel_values=inputs["pixel_values"],
        image_grid_thw=grid,
        mm_token_type_ids=inputs["mm_token_type_ids"],
    )
    with torch.no_grad():
        visual = hf.model.visual(inputs["pixel_values"].to(pixel_dtype), grid_thw=grid)
        positions, delta = hf.model.get_rope_index(
            ids.view(1, -1),
            inputs["mm_token_type_ids"],
            image_grid_thw=grid,
            attention_mask=torch.ones(1, ids.numel()),
        )
        hf.model.rope_deltas = None
        logits = hf(input_ids=ids.view(1, -1), **kwargs).logits[0].float()
    return dict(
        embeds=visual.pooler_output.float(),
        deepstack=[f.float() for f in visual.deepstack_features],
        positions=positions[:, 0],
        delta=int(delta),
        logits=logits,
        kwargs=kwargs,
    )


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, checkpoint):
    _, hf = checkpoint
    images = [Image.fromarray(synthetic_frame(h, w, seed=i)) for i, (h, w) in enumerate(CASES[request.param])]
    inputs = hf_multimodal_inputs(build_tokenizer(), hf_image_processor(**PIXELS), images, PROMPT)
    return Case(name=request.param, images=images, inputs=inputs, hf=hf_outputs(hf, inputs))


def features_cat(features) -> tuple[torch.Tensor, list[torch.Tensor]]:
    levels = zip(*(f.deepstack for f in features), strict=True)
    return torch.cat([f.embeds for f in features]), [torch.cat(level) for level in levels]


def test_vision_embeds_and_every_deepstack_level_match_float32(vlm, case, record_figure):
    embeds, deepstack = features_cat(vlm.encode_images(case["images"]))
    p = pcc(case["hf"]["embeds"], embeds)
    record_figure("float32 image embeds PCC", p)
    record_figure("float32 image embeds max abs", max_abs_error(case["hf"]["embeds"], embeds))
    assert p >= 0.99999
    assert len(deepstack) == len(VISION["deepstack_visual_indexes"])
    for k, (expected, actual) in enumerate(zip(case["hf"]["deepstack"], deepstack, strict=True)):
        p = pcc(expected, actual)
        record_figure(f"float32 deepstack[{k}] PCC", p)
        record_figure(f"float32 deepstack[{k}] max abs", max_abs_error(expected, actual))
        assert p >= 0.99999


def test_prompt_expansion_and_position_ids_are_identical(vlm, case):
    features = vlm.encode_images(case["images"])
    content = [{"type": "image"} for _ in features] + [{"type": "text", "text": PROMPT}]
    rendered = build_tokenizer().apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ids = vlm.expand_image_pads(rendered, features)
    assert ids == case["inputs"]["ids"].tolist()
    positions, delta = mrope_position_ids(torch.tensor(ids), case["inputs"]["image_grid_thw"], vlm.config)
    assert torch.equal(positions, case["hf"]["positions"])
    assert delta == case["hf"]["delta"] < 0


def test_prefill_logits_match_float32(vlm, case, record_figure):
    ids = case["inputs"]["ids"]
    vlm.setup_cache(ids.numel())
    actual = vlm.text.logits(vlm.prefill_hidden(ids, vlm.encode_images(case["images"])))
    p, err = pcc(case["hf"]["logits"], actual), max_abs_error(case["hf"]["logits"], actual)
    record_figure("float32 prefill logits PCC", p)
    record_figure("float32 prefill logits max abs", err)
    assert p >= 0.99999 and err <= 1e-4


def test_greedy_tokens_match_generate(vlm, checkpoint, case):
    ids = case["inputs"]["ids"]
    expected = hf_greedy(checkpoint[1], ids, NEW_TOKENS, **case["hf"]["kwargs"])
    vlm.setup_cache(ids.numel() + NEW_TOKENS)
    logits = vlm.prefill(ids, vlm.encode_images(case["images"]))
    assert greedy_continue(vlm, logits, NEW_TOKENS) == expected


def test_bfloat16_matches_transformers_bfloat16(vlm_bf16, hf_bf16, case, record_figure):
    expected = hf_outputs(hf_bf16, case["inputs"], torch.bfloat16)
    features = vlm_bf16.encode_images(case["images"])
    embeds, deepstack = features_cat(features)
    assert embeds.dtype == torch.bfloat16
    figures = {"image embeds": pcc(expected["embeds"], embeds)}
    figures |= {
        f"deepstack[{k}]": pcc(e, a)
        for k, (e, a) in enumerate(zip(expected["deepstack"], deepstack, strict=True))
    }
    vlm_bf16.setup_cache(case["inputs"]["ids"].numel())
    figures["prefill logits"] = pcc(
        expected["logits"], vlm_bf16.text.logits(vlm_bf16.prefill_hidden(case["inputs"]["ids"], features))
    )
    for name, p in figures.items():
        record_figure(f"bfloat16 {name} PCC", p)
    assert min(figures.values()) >= 0.999


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """The same vision tower and text dims with a sparse MoE MLP in every decoder layer (8 experts, top-2)."""
    path = tmp_path_factory.mktemp("vlm-moe")
    hf = save_checkpoint(path, TEXT, vision=VISION, moe=True, seed=37)
    save_preprocessor_config(path, **PIXELS)
    return path, hf


def test_moe_backbone_with_images_matches_transformers(moe_checkpoint, record_figure):
    """Images through the vision encoder into a Qwen3-VL-MoE text backbone: logits and greedy tokens."""
    path, hf = moe_checkpoint
    sizes = CASES["2-images-of-different-sizes"]
    images = [Image.fromarray(synthetic_frame(h, w, seed=i)) for i, (h, w) in enumerate(sizes)]
    inputs = hf_multimodal_inputs(build_tokenizer(), hf_image_processor(**PIXELS), images, PROMPT)
    expected = hf_outputs(hf, inputs)
    vlm = VisionLanguageModel.from_checkpoint(path)
    ids = inputs["ids"]
    features = vlm.encode_images(images)
    vlm.setup_cache(ids.numel() + NEW_TOKENS)
    actual = vlm.text.logits(vlm.prefill_hidden(ids, features))
    p, err = pcc(expected["logits"], actual), max_abs_error(expected["logits"], actual)
    record_figure("float32 prefill logits PCC", p)
    record_figure("float32 prefill logits max abs", err)
    assert p >= 0.99999 and err <= 1e-4
    tokens = hf_greedy(hf, ids, NEW_TOKENS, **expected["kwargs"])
    assert greedy_continue(vlm, vlm.prefill(ids, features), NEW_TOKENS) == tokens


def test_an_image_encodes_the_same_alone_or_among_others(vlm, record_figure):
    images = [
        synthetic_frame(96, 160, seed=1),
        synthetic_frame(64, 128, seed=2),
        synthetic_frame(96, 160, seed=3),
    ]
    together = vlm.encode_images(images)
    worst = 0.0
    for image, joint in zip(images, together, strict=True):
        (alone,) = vlm.encode_images([image])
        assert alone.grid_thw == joint.grid_thw
        for a, b in zip((alone.embeds, *alone.deepstack), (joint.embeds, *joint.deepstack), strict=True):
            worst = max(worst, max_abs_error(a, b))
    record_figure("max abs, alone vs among others", worst)
    assert worst <= 1e-5


def alpamayo_layout(source, path, **top_level):
    """A copy of HF checkpoint `source` at `path` in the Alpamayo layout: config.json nests the VLM config under
    `vlm_config` beside the `top_level` keys, weights are prefixed `vlm.` beside an action-expert tensor."""
    shutil.copytree(source, path)
    cfg = json.loads((path / "config.json").read_text())
    alpamayo_cfg = {"model_type": "alpamayo_vla", "vlm_config": cfg, **top_level}
    (path / "config.json").write_text(json.dumps(alpamayo_cfg))
    tensors = load_file(path / "model.safetensors")
    tensors = {"vlm." + k: v for k, v in tensors.items()} | {"action_expert.proj.weight": torch.ones(2)}
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def test_alpamayo_layout_gives_identical_logits(checkpoint, vlm, tmp_path):
    path = alpamayo_layout(checkpoint[0], tmp_path / "alpamayo")
    alpamayo = VisionLanguageModel.from_checkpoint(path)
    images = [synthetic_frame(64, 96)]
    ids = vlm.expand_image_pads([1, IMAGE_PAD, 2], vlm.encode_images(images))
    logits = []
    for model in (vlm, alpamayo):
        model.setup_cache(len(ids))
        logits.append(model.prefill(ids, model.encode_images(images)))
    assert torch.equal(*logits)


@pytest.mark.parametrize("preprocessor_file", ["absent", "with-other-bounds"])
def test_alpamayo_config_pixel_bounds_override_the_preprocessor_config(
    checkpoint, tmp_path, preprocessor_file
):
    """Alpamayo's config.json `min_pixels` / `max_pixels` (the keyword overrides it gives its image processor)
    win over preprocessor_config.json and over Qwen3-VL's defaults: a 1080x1920 frame becomes 180 tokens."""
    path = alpamayo_layout(checkpoint[0], tmp_path / "alpamayo", **ALPAMAYO_PIXELS)
    if preprocessor_file == "absent":
        (path / "preprocessor_config.json").unlink()
    model = VisionLanguageModel.from_checkpoint(path)
    assert (model.preprocess.min_pixels, model.preprocess.max_pixels) == tuple(ALPAMAYO_PIXELS.values())
    frame = synthetic_frame(1080, 1920)
    (features,) = model.encode_images([frame])
    expected = hf_image_processor(**ALPAMAYO_PIXELS)(images=[frame], return_tensors="pt")["image_grid_thw"]
    assert features.grid_thw == tuple(expected[0].tolist()) == (1, 20, 36)
    assert features.embeds.shape[0] == 180


def test_alpamayo_config_pixel_bounds_that_cross_are_rejected(checkpoint, tmp_path):
    path = alpamayo_layout(checkpoint[0], tmp_path / "alpamayo", min_pixels=196608, max_pixels=163840)
    with pytest.raises(ConfigError, match=r"config.json: min_pixels 196608 must be <= max_pixels 163840"):
        VisionLanguageModel.from_checkpoint(path)


def test_pad_count_that_does_not_match_the_grids_is_rejected(vlm):
    grid = torch.tensor([[1, 4, 6], [1, 2, 4]])  # 6 + 2 tokens
    ids = torch.tensor([5, *[IMAGE_PAD] * 7, 6])
    with pytest.raises(
        ValueError, match=r"has 7 <\|image_pad\|> tokens but the 2 image grid\(s\) .* need 8 \(\[6, 2\]\)"
    ):
        mrope_position_ids(ids, grid, vlm.config)
    split = torch.tensor([5, *[IMAGE_PAD] * 3, 6, *[IMAGE_PAD] * 5])
    with pytest.raises(ValueError, match=r"image 0 needs 6 consecutive <\|image_pad\|> tokens from index 1"):
        mrope_position_ids(split, grid, vlm.config)
    with pytest.raises(
        ValueError, match=r"the prompt has 1 <\|image_pad\|> token\(s\) \(id 262\) for 2 image\(s\)"
    ):
        expand_image_pads([5, IMAGE_PAD, 6], grid, vlm.config)
    with pytest.raises(ValueError, match=r"holds <\|image_pad\|> tokens \(id 262\) but no image grids"):
        mrope_position_ids(ids, None, vlm.config)
    video = torch.tensor([5, TOKEN_IDS["<|video_pad|>"]])
    with pytest.raises(ValueError, match=r"<\|video_pad\|> tokens \(id 263\); video is unsupported"):
        mrope_position_ids(video, None, vlm.config)


def test_text_only_positions_are_a_plain_range(vlm):
    positions, delta = mrope_position_ids(torch.arange(7), None, vlm.config)
    assert torch.equal(positions, torch.arange(7).expand(3, -1)) and delta == 0


def test_encoder_inputs_are_checked(vlm):
    grid = torch.tensor([[1, 4, 6]])
    with pytest.raises(
        ValueError,
        match=r"pixel_values must have shape \[24, 1536\] for grid_thw \[\[1, 4, 6\]\], got \[23, 1536\]",
    ):
        vlm.vision.encode(torch.zeros(23, 1536), grid)
    with pytest.raises(ValueError, match=r"grid_thw\[0\] = \[1, 3, 6\]: .* multiples of the merge size 2"):
        vlm.vision.encode(torch.zeros(18, 1536), torch.tensor([[1, 3, 6]]))


def test_preprocessor_that_disagrees_with_the_vision_config_is_rejected(checkpoint, tmp_path):
    path = tmp_path / "mismatch"
    shutil.copytree(checkpoint[0], path)
    raw = json.loads((path / "preprocessor_config.json").read_text())
    (path / "preprocessor_config.json").write_text(json.dumps(raw | {"patch_size": 14}))
    with pytest.raises(
        ConfigError, match=r"patch/merge/temporal sizes \(14, 2, 2\) differ from vision_config's \(16, 2, 2\)"
    ):
        VisionLanguageModel.from_checkpoint(path)


def test_checkpoint_without_a_vision_tower_is_rejected(checkpoint, tmp_path):
    path = tmp_path / "text-only"
    shutil.copytree(checkpoint[0], path)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["vision_config"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"needs vision_config and image_token_id"):
        VisionLanguageModel.from_checkpoint(path)
    with pytest.raises(ConfigError, match=r"no vision_config, so the checkpoint has no vision tower"):
        VisionEncoder.from_checkpoint(path)


@pytest.mark.cuda
def test_cuda_matches_transformers_on_cpu(checkpoint, case):
    ids = case["inputs"]["ids"]
    for dtype, floor in ((torch.float32, 0.99999), (torch.bfloat16, 0.999)):
        model = VisionLanguageModel.from_checkpoint(checkpoint[0], BackendOptions(dtype=dtype, device="cuda"))
        features = model.encode_images(case["images"])
        model.setup_cache(ids.numel())
        logits = model.text.logits(model.prefill_hidden(ids, features)).cpu()
        assert pcc(case["hf"]["embeds"], features_cat(features)[0].cpu()) >= floor
        assert pcc(case["hf"]["logits"], logits) >= floor
