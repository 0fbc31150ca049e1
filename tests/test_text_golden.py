"""The torch text backbone against transformers' Qwen3VL(Moe)ForConditionalGeneration on saved random checkpoints.

MoE checkpoints are tested in both on-disk expert layouts: as transformers 5 saves them ([E, 2I, H] /
[E, H, I]) and rewritten as the released hub files hold them ([E, H, 2I] / [E, I, H]); the reference is then
transformers loading that same file.
"""

from __future__ import annotations

import json

import pytest
import torch

from alpamayo.generation import greedy_continue
from alpamayo.numerics import max_abs_error, pcc
from alpamayo.text import TextModel
from tests.hf_checkpoints import (
    IMAGE_VISION,
    hf_generate,
    hf_greedy,
    image_prefill_inputs,
    image_reference,
    load_hf,
    rewrite_hub_layout,
    save_checkpoint,
    text_config,
)

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
MOE_GOLDEN = {
    # every layer sparse: 8 experts, top-2, 2 * moe_intermediate (48) != hidden (64), GQA 2:1
    "all-sparse": dict(text=text_config(num_hidden_layers=3), tie=False),
    # the real top-8, head_dim 128 and mrope sections [24, 20, 20]; 32 experts. (transformers' grouped_mm
    # experts fail on CPU for widths whose rows are not 16-byte multiples, hence moe_intermediate 56.)
    "top8-of-32": dict(
        text=dict(
            GOLDEN["real-head-dim"]["text"], num_experts=32, num_experts_per_tok=8, moe_intermediate_size=56
        ),
        tie=False,
    ),
    # dense layers among sparse ones: decoder_sparse_step 2 and mlp_only_layers [3] -> layers 1 and 5 sparse
    "mixed-dense": dict(
        text=text_config(
            num_hidden_layers=6,
            decoder_sparse_step=2,
            mlp_only_layers=[3],
            num_experts=6,
            num_experts_per_tok=3,
            moe_intermediate_size=40,
        ),
        tie=True,
    ),
}
GOLDEN |= {
    f"moe-{name}-{layout}": dict(spec, moe=True, layout=layout)
    for name, spec in MOE_GOLDEN.items()
    for layout in ("v5", "hub")
}


@pytest.fixture(scope="module", params=sorted(GOLDEN))
def golden(request, tmp_path_factory):
    spec = GOLDEN[request.param]
    path = tmp_path_factory.mktemp(request.param)
    seed = sorted(GOLDEN).index(request.param) + 7
    hf = save_checkpoint(path, spec["text"], tie=spec["tie"], moe=spec.get("moe", False), seed=seed)
    if spec.get("layout") == "hub":
        rewrite_hub_layout(path)
        hf = load_hf(path)  # transformers transposes hub-layout experts back on load
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


def test_decode_logits_bfloat16_match_generate(golden, record_figure):
    """bfloat16 decode steps (packed CPU weights; MoE: only the k chosen experts), teacher-forced on the tokens
    of transformers' own bfloat16 `generate`, give the logits it chose them from."""
    _name, path, _ = golden
    hf = load_hf(path, torch.bfloat16)
    ids = prompt(hf.config.text_config.vocab_size, seed=7)
    tokens, expected = hf_generate(hf, ids, 16)
    model = TextModel.from_checkpoint(path, dtype=torch.bfloat16)
    model.setup_cache(ids.numel() + 16)
    actual = torch.stack([model.prefill(ids), *(model.decode(t) for t in tokens[:-1])])
    p = min(pcc(e, a) for e, a in zip(expected, actual, strict=True))
    record_figure("bfloat16 decode logits min PCC", p)
    record_figure("bfloat16 decode logits max abs", max_abs_error(expected, actual))
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


def test_forked_rows_decoding_different_tokens_match_single_sequences(golden):
    """One decode step over rows with different tokens (an MoE routes each row to its own experts)."""
    _, path, hf = golden
    ids = prompt(hf.config.text_config.vocab_size, seed=4)
    tokens = (5, 77, 140)
    model = TextModel.from_checkpoint(path)
    model.setup_cache(ids.numel() + 1, max_batch=3)
    single = []
    for t in tokens:
        model.prefill(ids)
        single.append(model.decode(t))
    model.prefill(ids)
    model.fork(3)
    assert max_abs_error(torch.stack(single), model.decode(torch.tensor(tokens))) <= 1e-5


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


@pytest.fixture(scope="module", params=["real-head-dim", "moe-top8-of-32-v5"])
def image_case(request, tmp_path_factory):
    """A checkpoint plus one 64x96 image prompt, and transformers' own image features and positions."""
    path = tmp_path_factory.mktemp(f"deepstack-{request.param}")
    spec = GOLDEN[request.param]
    hf = save_checkpoint(path, spec["text"], vision=IMAGE_VISION, moe=spec.get("moe", False), seed=11)
    return Case(path=path, hf=hf, **image_reference(hf))


class Case(dict):
    def __repr__(self) -> str:
        return f"Case({self['path'].name})"


def test_deepstack_and_3row_positions_match_transformers(image_case, record_figure):
    model = TextModel.from_checkpoint(image_case["path"])
    model.setup_cache(96)
    embeds, mask = image_prefill_inputs(model, image_case)
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
    embeds, mask = image_prefill_inputs(model, image_case)
    logits = model.prefill(embeds, image_case["positions"], mask, image_case["deepstack"])
    assert greedy_continue(model, logits, 32) == expected


def test_deepstack_shape_mismatch_is_rejected(image_case):
    model = TextModel.from_checkpoint(image_case["path"])
    model.setup_cache(96)
    embeds, mask = image_prefill_inputs(model, image_case)
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
