"""The torch text backbone against transformers' Qwen3VLForConditionalGeneration on saved random checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from alpamayo.generation import greedy_continue
from alpamayo.numerics import max_abs_error, pcc
from alpamayo.text import TextModel
from tests.hf_checkpoints import TOKEN_IDS, hf_greedy, load_hf, save_checkpoint, text_config

GOLDEN = {
    # GQA 4:1, head_dim (32) != hidden/heads (12), odd vocab/intermediate, attention biases, untied head
    "gqa4-bias-untied": dict(
        text=text_config(
            vocab_size=317,
            hidden_size=96,
            intermediate_size=203,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=32,
            attention_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [6, 5, 5]},
        ),
        tie=False,
    ),
    # plain multi-head attention (GQA 1:1), head_dim == hidden/heads, tied head
    "mha-tied": dict(
        text=text_config(
            vocab_size=300,
            hidden_size=80,
            intermediate_size=144,
            num_hidden_layers=2,
            num_attention_heads=5,
            num_key_value_heads=5,
            head_dim=16,
        ),
        tie=True,
    ),
    # the real head_dim 128 and mrope sections [24, 20, 20], GQA 2:1, hidden != heads*head_dim (like 4B)
    "real-head-dim": dict(
        text=text_config(
            vocab_size=512,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": [24, 20, 20],
            },
        ),
        tie=False,
    ),
}


@pytest.fixture(scope="module", params=sorted(GOLDEN))
def golden(request, tmp_path_factory):
    spec = GOLDEN[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf = save_checkpoint(path, spec["text"], tie=spec["tie"], seed=sorted(GOLDEN).index(request.param) + 7)
    return Golden(request.param, path, hf)


class Golden(tuple):
    """(name, checkpoint dir, transformers model); the short repr keeps failure reports readable."""

    def __new__(cls, name, path, hf):
        return super().__new__(cls, (name, path, hf))

    def __repr__(self) -> str:
        return f"Golden({self[0]!r})"


def prompt(vocab: int, length: int = 37, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, min(vocab, 256), (length,), generator=torch.Generator().manual_seed(seed))


def test_prefill_logits_float32_match_transformers(golden, record_figure):
    _name, path, hf = golden
    ids = prompt(hf.config.text_config.vocab_size)
    with torch.no_grad():
        expected = hf(input_ids=ids.view(1, -1)).logits[0]
    model = TextModel.from_checkpoint(path)
    model.setup_cache(64)
    actual = model.logits(model.prefill_hidden(ids))
    assert max_abs_error(model.prefill(ids), actual[-1]) <= 1e-5
    p, err = pcc(expected, actual), max_abs_error(expected, actual)
    record_figure("float32 prefill logits PCC", p)
    record_figure("float32 prefill logits max abs", err)
    assert p >= 0.99999
    assert err <= 1e-4


def test_greedy_decode_float32_matches_generate_for_64_tokens(golden):
    _, path, hf = golden
    ids = prompt(hf.config.text_config.vocab_size, seed=1)
    expected = hf_greedy(hf, ids, 64)
    model = TextModel.from_checkpoint(path)
    model.setup_cache(ids.numel() + 64)
    assert greedy_continue(model, model.prefill(ids), 64) == expected


def test_decode_logits_match_full_forward(golden):
    """Each cached decode step equals the full (uncached) forward at that position."""
    _, path, hf = golden
    ids = prompt(hf.config.text_config.vocab_size, length=48, seed=2)
    with torch.no_grad():
        expected = hf(input_ids=ids.view(1, -1)).logits[0]
    model = TextModel.from_checkpoint(path)
    model.setup_cache(48)
    model.prefill(ids[:40])
    for pos in range(40, 48):
        step = model.decode(int(ids[pos]))
        assert max_abs_error(expected[pos], step) <= 1e-4


def test_prefill_logits_bfloat16_match_transformers(golden, record_figure):
    _name, path, _ = golden
    hf = load_hf(path, torch.bfloat16)
    ids = prompt(hf.config.text_config.vocab_size, seed=3)
    with torch.no_grad():
        expected = hf(input_ids=ids.view(1, -1)).logits[0].float()
    model = TextModel.from_checkpoint(path, dtype=torch.bfloat16)
    model.setup_cache(64)
    actual = model.logits(model.prefill_hidden(ids))
    p = pcc(expected, actual)
    record_figure("bfloat16 prefill logits PCC", p)
    assert p >= 0.999


def test_forked_rows_decode_like_a_single_sequence(golden):
    """fork(n) shares one prefill: every row then decodes exactly as the unforked sequence would."""
    _, path, hf = golden
    ids = prompt(hf.config.text_config.vocab_size, seed=4)
    model = TextModel.from_checkpoint(path)
    model.setup_cache(ids.numel() + 4, max_batch=3)
    first = model.prefill(ids)
    single = [model.decode(t) for t in (5, 9)]
    model.prefill(ids)
    model.fork(3)
    for t, ref in zip((5, 9), single, strict=True):
        rows = model.decode(torch.tensor([t, t, t]))
        assert max_abs_error(ref.expand(3, -1), rows) <= 1e-5
    assert first.shape == (hf.config.text_config.vocab_size,)


def test_hub_rope_spelling_loads_to_identical_logits(tmp_path):
    """A hub config.json (rope_scaling + rope_theta) and the v5 spelling (rope_parameters) give the same model."""
    spec = GOLDEN["gqa4-bias-untied"]
    save_checkpoint(tmp_path, spec["text"], seed=3)
    ids = prompt(317, seed=5)
    model = TextModel.from_checkpoint(tmp_path)
    model.setup_cache(64)
    v5 = model.prefill(ids)
    cfg = json.loads((tmp_path / "config.json").read_text())
    rope = cfg["text_config"].pop("rope_parameters")
    cfg["text_config"]["rope_theta"] = rope.pop("rope_theta")
    cfg["text_config"]["rope_scaling"] = dict(rope, mrope_interleaved=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = TextModel.from_checkpoint(tmp_path)
    model.setup_cache(64)
    assert torch.equal(model.prefill(ids), v5)


@pytest.fixture(scope="module")
def image_case(tmp_path_factory):
    """A checkpoint plus one 64x96 image prompt, and transformers' own image features and positions."""
    path = tmp_path_factory.mktemp("deepstack")
    text = GOLDEN["real-head-dim"]["text"]
    # 3 DeepStack levels at uneven blocks incl. the last; learned 4x4 position grid vs a 4x6 patch grid
    vision = dict(
        depth=4,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        in_channels=3,
        patch_size=16,
        temporal_patch_size=2,
        spatial_merge_size=2,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0, 2, 3],
        hidden_act="gelu_pytorch_tanh",
    )
    hf = save_checkpoint(path, text, vision=vision, seed=11)
    n_img = (4 * 6) // 4
    ids = torch.tensor(
        [
            TOKEN_IDS["<|im_start|>"],
            *b"user\n",
            TOKEN_IDS["<|vision_start|>"],
            *[TOKEN_IDS["<|image_pad|>"]] * n_img,
            TOKEN_IDS["<|vision_end|>"],
            *b"Describe this image.",
            TOKEN_IDS["<|im_end|>"],
            *b"\n",
            TOKEN_IDS["<|im_start|>"],
            *b"assistant\n",
        ]
    )
    grid = torch.tensor([[1, 4, 6]])
    pixels = torch.randn(24, 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0))
    mm_types = (ids == TOKEN_IDS["<|image_pad|>"]).to(torch.int32).view(1, -1)
    hf_inputs = dict(pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=mm_types)
    with torch.no_grad():
        hf.model.rope_deltas = None
        logits = hf(input_ids=ids.view(1, -1), **hf_inputs).logits[0]
        visual = hf.model.visual(pixels, grid_thw=grid)
        positions, deltas = hf.model.get_rope_index(
            ids.view(1, -1),
            mm_types,
            image_grid_thw=grid,
            attention_mask=torch.ones(1, ids.numel(), dtype=torch.long),
        )
    return Case(
        path=path,
        hf=hf,
        ids=ids,
        hf_inputs=hf_inputs,
        logits=logits,
        image_embeds=visual.pooler_output,
        deepstack=list(visual.deepstack_features),
        positions=positions[:, 0],
        delta=int(deltas),
    )


class Case(dict):
    def __repr__(self) -> str:
        return f"Case({self['path'].name})"


def _image_prefill_inputs(model: TextModel, case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    mask = case["ids"] == TOKEN_IDS["<|image_pad|>"]
    embeds = model.embed(case["ids"]).clone()
    embeds[mask] = case["image_embeds"]
    return embeds, mask


def test_deepstack_and_3row_positions_match_transformers(image_case, record_figure):
    model = TextModel.from_checkpoint(image_case["path"])
    model.setup_cache(96)
    embeds, mask = _image_prefill_inputs(model, image_case)
    hidden = model.prefill_hidden(embeds, image_case["positions"], mask, image_case["deepstack"])
    actual = model.logits(hidden)
    p, err = pcc(image_case["logits"], actual), max_abs_error(image_case["logits"], actual)
    record_figure("image prompt logits PCC", p)
    record_figure("image prompt logits max abs", err)
    assert p >= 0.99999 and err <= 1e-4
    assert model.rope_delta == image_case["delta"] < 0


def test_decode_after_image_prompt_uses_rope_delta(image_case):
    """Greedy tokens after an image prompt equal `generate` with pixel values (decode positions carry rope_delta)."""
    expected = hf_greedy(image_case["hf"], image_case["ids"], 32, **image_case["hf_inputs"])
    model = TextModel.from_checkpoint(image_case["path"])
    model.setup_cache(image_case["ids"].numel() + 32)
    embeds, mask = _image_prefill_inputs(model, image_case)
    logits = model.prefill(embeds, image_case["positions"], mask, image_case["deepstack"])
    assert greedy_continue(model, logits, 32) == expected


def test_deepstack_shape_mismatch_is_rejected(image_case):
    model = TextModel.from_checkpoint(image_case["path"])
    model.setup_cache(96)
    embeds, mask = _image_prefill_inputs(model, image_case)
    bad = [f[:-1] for f in image_case["deepstack"]]
    with pytest.raises(ValueError, match=r"deepstack\[0\] has shape \[5, 128\], expected \[6, 128\]"):
        model.prefill(embeds, image_case["positions"], mask, bad)


@pytest.mark.cuda
def test_cuda_prefill_and_decode_match_transformers_on_cpu(golden):
    _, path, hf = golden
    ids = prompt(hf.config.text_config.vocab_size, seed=6)
    with torch.no_grad():
        expected = hf(input_ids=ids.view(1, -1)).logits[0]
    for dtype, floor in ((torch.float32, 0.99999), (torch.bfloat16, 0.999)):
        model = TextModel.from_checkpoint(path, dtype=dtype, device="cuda")
        model.setup_cache(64)
        actual = model.logits(model.prefill_hidden(ids.cuda())).cpu()
        assert pcc(expected, actual) >= floor
    model = TextModel.from_checkpoint(path, device="cuda")
    model.setup_cache(ids.numel() + 16)
    assert greedy_continue(model, model.prefill(ids.cuda()), 16) == hf_greedy(hf, ids, 16)
