"""`alpamayo generate --image` on a transformers-saved Qwen3-VL checkpoint, against transformers' generate."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from alpamayo.cli import main
from tests.hf_checkpoints import (
    build_tokenizer,
    hf_multimodal_inputs,
    save_checkpoint,
    save_preprocessor_config,
    text_config,
)
from tests.images import synthetic_frame

PROMPT = "Which way is the road turning?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-vlm")
    hf = save_checkpoint(path, text_config(num_hidden_layers=3), seed=41)
    save_preprocessor_config(path, min_pixels=32 * 32, max_pixels=1 << 20)
    images = []
    for i, (h, w) in enumerate([(64, 96), (128, 64)]):
        images.append(path / f"camera{i}.png")
        Image.fromarray(synthetic_frame(h, w, seed=i)).save(images[-1])
    return path, hf, images


def test_generate_with_images_matches_transformers(checkpoint, capsys):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path, hf, images = checkpoint
    argv = ["generate", "--checkpoint", str(path), "--prompt", PROMPT, "--max-new-tokens", "24", "--json"]
    assert main([*argv, "--image", str(images[0]), "--image", str(images[1])]) == 0
    out = json.loads(capsys.readouterr().out)
    processor = Qwen2VLImageProcessorPil.from_pretrained(path)  # the same preprocessor_config.json
    inputs = hf_multimodal_inputs(build_tokenizer(), processor, [Image.open(p) for p in images], PROMPT)
    assert out["prompt_token_ids"] == inputs["ids"].tolist()
    with torch.no_grad():
        hf.model.rope_deltas = None
        ids = inputs.pop("ids").view(1, -1)
        gen = hf.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, **inputs
        )
    assert out["token_ids"] == gen[0, ids.shape[1] :].tolist()
    assert out["text"] == build_tokenizer().decode(out["token_ids"], skip_special_tokens=True)


def test_unreadable_image_is_reported_by_path(checkpoint, tmp_path, capsys):
    path, _, _ = checkpoint
    bad = tmp_path / "not-an-image.png"
    bad.write_text("hello")
    assert main(["generate", "--checkpoint", str(path), "--prompt", PROMPT, "--image", str(bad)]) == 2
    assert f"alpamayo generate: error: --image {bad}: cannot read the image" in capsys.readouterr().err
