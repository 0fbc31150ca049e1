"""Small random-weight Qwen3-VL checkpoints built with `transformers` and `save_pretrained`, fully offline.

These are the golden references of the test suite: the model under test loads the saved files, and the same
`transformers` model (or a fresh `from_pretrained` of it) produces the expected numbers.

Every parameter is re-initialised with a seeded generator (`alpamayo.demo_checkpoint.randomize_weights`:
norm weights 1 + 0.1 N, biases 0.05 N, matrices N / sqrt(fan_in)).
The tokenizer is byte level (ids 0..255) plus the Qwen specials at 256..263, with a minimal Qwen3-VL chat
template (images render as <|vision_start|><|image_pad|><|vision_end|>).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from alpamayo.demo_checkpoint import hf_vlm, randomize_weights

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
TOKEN_IDS = {s: 256 + i for i, s in enumerate(SPECIALS)}
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for item in message.content %}"
    "{%- if item.type == 'image' or 'image' in item %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif 'text' in item %}{{- item.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Vision tower used when a test does not care about vision: 2 blocks, DeepStack after both.
SMALL_VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    in_channels=3,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0, 1],
    hidden_act="gelu_pytorch_tanh",
)


def text_config(**overrides: Any) -> dict[str, Any]:
    """A small text config; `overrides` replace any field (e.g. heads, head_dim, rope_parameters)."""
    cfg = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        attention_bias=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
        bos_token_id=None,
        eos_token_id=TOKEN_IDS["<|im_end|>"],
        pad_token_id=TOKEN_IDS["<|endoftext|>"],
    )
    cfg.update(overrides)
    return cfg


# MoE settings merged under a text config when `save_checkpoint(..., moe=True)`; transformers' defaults (60
# experts of width 1408) would dwarf the small test models. 2 * 24 != hidden 64, so the two on-disk expert
# layouts (hub [E, H, 2I] vs transformers 5 [E, 2I, H]) cannot be confused.
MOE_TEXT = dict(
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, decoder_sparse_step=1, mlp_only_layers=[]
)
EXPERT_KEYS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def build_tokenizer():
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def hf_config(
    text: dict[str, Any], vision: dict[str, Any] | None = None, tie: bool = False, moe: bool = False
):
    from transformers import Qwen3VLConfig, Qwen3VLMoeConfig

    cls = Qwen3VLMoeConfig if moe else Qwen3VLConfig
    vision = dict(vision or SMALL_VISION, out_hidden_size=text["hidden_size"])
    return cls(
        text_config=text,
        vision_config=vision,
        image_token_id=TOKEN_IDS["<|image_pad|>"],
        video_token_id=TOKEN_IDS["<|video_pad|>"],
        vision_start_token_id=TOKEN_IDS["<|vision_start|>"],
        vision_end_token_id=TOKEN_IDS["<|vision_end|>"],
        tie_word_embeddings=tie,
    )


def save_checkpoint(
    out_dir: Path,
    text: dict[str, Any],
    vision: dict[str, Any] | None = None,
    tie: bool = False,
    moe: bool = False,
    seed: int = 0,
) -> torch.nn.Module:
    """Build, randomise and `save_pretrained` a Qwen3-VL(-MoE) model with tokenizer; returns the fp32 model.

    With `moe`, `MOE_TEXT` fills the MoE fields `text` does not set. Experts are saved in transformers 5's
    layout; `rewrite_hub_layout` turns the file into the released hub layout.
    """
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration

    cls = Qwen3VLMoeForConditionalGeneration if moe else Qwen3VLForConditionalGeneration
    if moe:
        text = {**MOE_TEXT, **text}
    torch.manual_seed(seed)
    model = cls(hf_config(text, vision, tie, moe))
    randomize_weights(model, seed)
    if tie:
        model.tie_weights()
    model.eval()
    model.generation_config.eos_token_id = TOKEN_IDS["<|im_end|>"]
    model.generation_config.pad_token_id = TOKEN_IDS["<|endoftext|>"]
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    build_tokenizer().save_pretrained(out_dir)
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return model


def rewrite_hub_layout(directory: Path, suffixes: tuple[str, ...] = EXPERT_KEYS) -> int:
    """Rewrite a saved MoE checkpoint with experts as the hub files hold them (gate_up [E, H, 2I], down [E, I, H]).

    transformers 5 transposes such files back on load (as `reference/make_tiny.py::hub_layout_check` checks).
    Only tensors whose names end with one of `suffixes` are rewritten; returns how many were.
    """
    path = directory / "model.safetensors"
    tensors = load_file(path)
    experts = [k for k in tensors if k.endswith(suffixes)]
    for key in experts:
        tensors[key] = tensors[key].transpose(1, 2).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    return len(experts)


def load_hf(directory: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """transformers' own load of a saved checkpoint; config.json's architecture picks dense or MoE."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(directory, dtype=dtype).eval()


@torch.no_grad()
def hf_generate(
    model: torch.nn.Module, ids: torch.Tensor, n: int, **inputs: Any
) -> tuple[list[int], torch.Tensor]:
    """`generate` greedily for exactly n tokens with EOS stopping off (so no EOS masking changes the logits).

    Returns the tokens and the float32 logits [n, V] each was chosen from (step 0: the prompt's last position).
    """
    from transformers import GenerationConfig

    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=n,
        pad_token_id=TOKEN_IDS["<|endoftext|>"],
        output_logits=True,
        return_dict_in_generate=True,
    )
    saved_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None  # generate() falls back to the model's EOS when ours is None
    try:
        model.model.rope_deltas = None
        out = model.generate(
            input_ids=ids.view(1, -1),
            attention_mask=torch.ones(1, ids.numel(), dtype=torch.long),
            generation_config=gen,
            **inputs,
        )
    finally:
        model.generation_config.eos_token_id = saved_eos
    tokens = out.sequences[0, ids.numel() :].tolist()
    assert len(tokens) == n, f"generate() stopped after {len(tokens)} of {n} tokens"
    return tokens, torch.stack(out.logits, 1)[0].float()


def hf_greedy(model: torch.nn.Module, ids: torch.Tensor, n: int, **inputs: Any) -> list[int]:
    """The tokens of `hf_generate`."""
    return hf_generate(model, ids, n, **inputs)[0]


# Vision tower of the image-prompt goldens: 3 DeepStack levels at uneven blocks incl. the last; a learned 4x4
# position grid vs the image's 4x6 patch grid.
IMAGE_VISION = dict(SMALL_VISION, depth=4, hidden_size=64, intermediate_size=128, num_heads=4)
IMAGE_VISION |= {"deepstack_visual_indexes": [0, 2, 3]}
IMAGE_GRID = (1, 4, 6)  # (t, h, w) patches of one 64x96 image -> 6 merged image tokens


@torch.no_grad()
def image_reference(hf: torch.nn.Module) -> dict[str, Any]:
    """One chat prompt with a 64x96 image, and what transformers computes for it.

    Returns ids [L], hf_inputs (pixel_values, image_grid_thw, mm_token_type_ids for `generate`), logits
    [L, V], image_embeds [6, H], deepstack (one [6, H] per level), positions [3, L] and the rope delta.
    """
    t, h, w = IMAGE_GRID
    ids = torch.tensor(
        [
            TOKEN_IDS["<|im_start|>"],
            *b"user\n",
            TOKEN_IDS["<|vision_start|>"],
            *[TOKEN_IDS["<|image_pad|>"]] * (t * h * w // 4),
            TOKEN_IDS["<|vision_end|>"],
            *b"Describe this image.",
            TOKEN_IDS["<|im_end|>"],
            *b"\n",
            TOKEN_IDS["<|im_start|>"],
            *b"assistant\n",
        ]
    )
    grid = torch.tensor([IMAGE_GRID])
    pixels = torch.randn(t * h * w, 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0))
    mm_types = (ids == TOKEN_IDS["<|image_pad|>"]).to(torch.int32).view(1, -1)
    hf_inputs = dict(pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=mm_types)
    hf.model.rope_deltas = None
    logits = hf(input_ids=ids.view(1, -1), **hf_inputs).logits[0]
    visual = hf.model.visual(pixels, grid_thw=grid)
    positions, deltas = hf.model.get_rope_index(
        ids.view(1, -1),
        mm_types,
        image_grid_thw=grid,
        attention_mask=torch.ones(1, ids.numel(), dtype=torch.long),
    )
    return dict(
        ids=ids,
        hf_inputs=hf_inputs,
        logits=logits,
        image_embeds=visual.pooler_output,
        deepstack=list(visual.deepstack_features),
        positions=positions[:, 0],
        delta=int(deltas),
    )


def image_prefill_inputs(model: Any, case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(embeddings [L, H] with transformers' image embeds scattered in, image-token mask [L]) for `model.prefill`."""
    mask = case["ids"] == TOKEN_IDS["<|image_pad|>"]
    embeds = model.embed(case["ids"]).clone()
    embeds[mask] = case["image_embeds"]
    return embeds, mask


# Qwen3-VL's published preprocessor_config.json values (transformers' class defaults are Qwen2-VL's).
QWEN3VL_PREPROCESSOR = dict(
    patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=3
)


def hf_image_processor(min_pixels: int = 65536, max_pixels: int = 16777216):
    """transformers' PIL-backend Qwen2-VL image processor (the one Qwen3-VL uses) with Qwen3-VL's values."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**QWEN3VL_PREPROCESSOR, min_pixels=min_pixels, max_pixels=max_pixels)


def hf_float_image_processor(min_pixels: int = 65536, max_pixels: int = 16777216, **overrides: Any):
    """transformers' torchvision-backend Qwen2-VL image processor with Qwen3-VL's values: the one NVIDIA's
    Alpamayo 2 Super code runs (transformers 4.57 makes `Qwen2VLImageProcessor` its fast class whenever
    torchvision is installed, and Super's pyproject requires torchvision)."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    settings = dict(QWEN3VL_PREPROCESSOR, **overrides)
    return Qwen2VLImageProcessor(**settings, min_pixels=min_pixels, max_pixels=max_pixels)


def nvidia_float_pixels(processor: Any, frames: list) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values, image_grid_thw) as Super's `helper.prepare_model_inputs` makes them: the uint8 RGB frames
    [H, W, 3] stacked as `image_frames` [N, 3, H, W], `images.float() / 255.0`, `do_rescale=False`."""
    images = torch.stack([torch.from_numpy(f).permute(2, 0, 1) for f in frames]).contiguous()
    out = processor(images=images.float() / 255.0, do_rescale=False, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def save_preprocessor_config(out_dir: Path, min_pixels: int, max_pixels: int) -> None:
    """Write preprocessor_config.json with transformers' own writer (`size: {shortest_edge, longest_edge}`)."""
    hf_image_processor(min_pixels, max_pixels).save_pretrained(out_dir)


def hf_multimodal_inputs(tokenizer, processor, images: list, prompt: str) -> dict[str, torch.Tensor]:
    """transformers' reference inputs for a user turn with `images` first, then `prompt`.

    Qwen3VLProcessor cannot be built here (its video processor needs torchvision), so its two steps are
    reproduced as it documents them: each `<|image_pad|>` becomes grid.prod() // merge^2 pads
    (`replace_image_token`) and `mm_token_type_ids` is 1 exactly at the pads.
    """
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": prompt}]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    vision = processor(images=images, return_tensors="pt")
    pad = "<|image_pad|>"
    for grid in vision["image_grid_thw"]:
        text = text.replace(pad, "\0" * (int(grid.prod()) // processor.merge_size**2), 1)
    ids = torch.tensor(tokenizer(text.replace("\0", pad), add_special_tokens=False)["input_ids"])
    return {
        "ids": ids,
        "pixel_values": vision["pixel_values"],
        "image_grid_thw": vision["image_grid_thw"],
        "mm_token_type_ids": (ids == TOKEN_IDS[pad]).to(torch.int32).view(1, -1),
    }


def load_alpamayo_hf(directory: Path) -> torch.nn.Module:
    """transformers' Qwen3-VL model holding the VLM of an Alpamayo-layout checkpoint (`vlm_config`, `vlm.`
    weights), such as the demo checkpoint: the golden reference for code that reads that layout. Every `vlm.`
    tensor must fit (strict); the action expert's (`expert.*`, `action_*_proj.*`) are not the VLM's."""
    model = hf_vlm(json.loads((directory / "config.json").read_text())["vlm_config"])
    weights = load_file(str(directory / "model.safetensors"))
    vlm = {k.removeprefix("vlm."): v for k, v in weights.items() if k.startswith("vlm.")}
    model.load_state_dict(vlm, strict=True)
    return model


class PlanConstraints:
    """transformers logits processor with the constraints of `alpamayo.decoding.loop.generate_plans`
    (reasoning without trajectory tokens or EOS, `<|traj_future_start|>` forced at the cap, then future-trajectory
    tokens only), for golden runs of `generate`."""

    def __init__(self, vocab, eos_ids, prompt_len: int, cap: int):
        self.prompt_len, self.cap = prompt_len, cap
        self.start = vocab.marker("traj_future_start")
        self.traj = torch.cat([torch.as_tensor(vocab.future_ids), torch.as_tensor(vocab.history_ids)])
        self.eos = torch.tensor(list(eos_ids))
        self.future = torch.as_tensor(vocab.future_ids)

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, float("-inf"))
        for row, ids in enumerate(input_ids[:, self.prompt_len :].tolist()):
            if self.start in ids:
                out[row, self.future] = scores[row, self.future]
            elif len(ids) == self.cap:
                out[row, self.start] = 0.0
            else:
                out[row] = scores[row]
                out[row, self.traj] = float("-inf")
                out[row, self.eos] = float("-inf")
        return out


@torch.no_grad()
def hf_plan_tokens(
    hf: torch.nn.Module, ids: torch.Tensor, vision: dict, cfg: Any, vocab: Any, cap: int, max_new_tokens: int
) -> list[int]:
    """transformers' greedy `generate` of a driving plan: the expanded prompt `ids` [L] with its images
    (`vision`: the image processor's pixel_values / image_grid_thw), under `PlanConstraints` with reasoning
    cap `cap`; `cfg` is the model's ModelConfig. Returns the `max_new_tokens` generated ids."""
    from transformers import GenerationConfig, LogitsProcessorList

    n = ids.numel()
    gen = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens)
    gen.eos_token_id, gen.pad_token_id = None, cfg.eos_token_ids[-1]
    hf.model.rope_deltas = None
    return hf.generate(
        input_ids=ids.view(1, -1),
        attention_mask=torch.ones(1, n, dtype=torch.long),
        pixel_values=vision["pixel_values"],
        image_grid_thw=vision["image_grid_thw"],
        mm_token_type_ids=(ids == cfg.image_token_id).to(torch.int32).view(1, -1),
        generation_config=gen,
        logits_processor=LogitsProcessorList([PlanConstraints(vocab, cfg.eos_token_ids, n, cap)]),
    )[0, n:].tolist()
