"""The embedded demo checkpoint: a tiny random-weight model, built offline, in the project's layout or in the
layout of a released Alpamayo (`layout=` "r1", "alpamayo1.5", "super": `alpamayo.demo_release`, whose
`make_demo_checkpoint` is the entry point for every layout).

`make_demo_checkpoint(out, seed)` writes, byte-for-byte the same for a given seed (on one software install):
  config.json              the project's layout: the Qwen3-VL config under `vlm_config`, trajectory settings on top,
                           the action expert's as Alpamayo 1.5 spells them (`expert_settings`: `expert_cfg`,
                           `action_in_proj_cfg`, `action_out_proj_cfg`, `diffusion_cfg`, no Hydra `_target_`)
  model.safetensors        random float32 weights, every VLM tensor prefixed `vlm.`, the expert's under 1.5's
                           names (`expert.layers.*`, `expert.norm.weight`, `action_in_proj.*`, `action_out_proj.*`)
  tokenizer.json, tokenizer_config.json, chat_template.jinja
                           byte-level BPE trained on `assets/demo_corpus.txt`, extended like Alpamayo's vocabulary
  generation_config.json   EOS ids
  preprocessor_config.json Alpamayo's image preprocessing (320x576 frames from 1080x1920: 180 tokens per image)

Vocabulary layout (ids), mirroring the real one (`<i0>` = 151669, vocab 155697) at a small scale:
  [0, 512)       byte alphabet (256) + BPE merges (256)
  [512, 538)     the 26 Qwen special tokens, `<|endoftext|>` .. `</think>`, in Qwen's order
  [538, 4538)    `<i0>` .. `<i3999>`: future bins 0..2999, then history bins 0..999
  [4538, 4566)   the Alpamayo markers (`<|prompt_start|>` ..), `<|image_pad|>` being already present
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from alpamayo.config.expert import ExpertConfig, parse_expert_config
from alpamayo.families.registry import MARKERS_1_5
from alpamayo.families.vocabulary import bin_token, extend_tokenizer
from alpamayo.tokenizer import qwen3vl_chat_template
from planner.settings import PlannerSettings

ASSETS = Path(__file__).resolve().parent / "assets"
CORPUS = ASSETS / "demo_corpus.txt"

BPE_VOCAB_SIZE = 512  # the corpus supports ~580 merges at min_frequency 2; 512 keeps the layout fixed
# Qwen2/3 added tokens in id order (151643..151668); (token, special). The tool/think tags are not special.
QWEN_ADDED_TOKENS = [
    *[(f"<|{n}|>", True) for n in ("endoftext", "im_start", "im_end", "object_ref_start", "object_ref_end")],
    *[(f"<|{n}|>", True) for n in ("box_start", "box_end", "quad_start", "quad_end", "vision_start")],
    *[(f"<|{n}|>", True) for n in ("vision_end", "vision_pad", "image_pad", "video_pad")],
    ("<tool_call>", False),
    ("</tool_call>", False),
    *[
        (f"<|{n}|>", True)
        for n in ("fim_prefix", "fim_middle", "fim_suffix", "fim_pad", "repo_name", "file_sep")
    ],
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
# Small enough for a 4-camera x 4-frame prediction (16 x 180 visual tokens, ~3k-token prefill) on 2 CPU cores;
# GQA 2:1, M-RoPE sections summing to head_dim / 2, three DeepStack levels like the real models.
DEMO_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "max_position_embeddings": 8192,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 5_000_000.0,
        "mrope_section": [6, 5, 5],
        "mrope_interleaved": True,
    },
}
DEMO_VISION = {
    "depth": 4,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 4,
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [1, 2, 3],
    "hidden_act": "gelu_pytorch_tanh",
}
# The action expert at toy size, as `expert_cfg` overrides of the text config: the VLM's 4 layers and KV layout
# (2 heads x 32) are kept, as the shared cache needs; the 10B releases use hidden 2048, 16 heads x 128,
# intermediate 8256 (`alpamayo.config.expert.RELEASE_10B_EXPERT`). Shared by every layout.
EXPERT_CFG = {"hidden_size": 64, "num_attention_heads": 2, "head_dim": 32, "intermediate_size": 96}
IN_PROJ = {"hidden_size": 32, "num_enc_layers": 2, "num_fourier_feats": 20, "max_freq": 100.0}
DIFFUSION = {"int_method": "euler", "num_inference_steps": 10}
# Alpamayo's processor settings (`helper.py`: min_pixels 163840, max_pixels 196608) with Qwen3-VL's
# normalisation: a 1080x1920 frame resizes to 320x576, a 20x36 patch grid, 180 merged tokens.
MIN_PIXELS, MAX_PIXELS = 163840, 196608
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen3VLProcessor",
    "do_convert_rgb": True,
    "do_resize": True,
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    "min_pixels": MIN_PIXELS,
    "max_pixels": MAX_PIXELS,
}


def build_tokenizer(markers: Sequence[str] = MARKERS_1_5, base: Any = None) -> Any:
    """The demo tokenizer: `base` (default: a fresh `base_tokenizer()`) extended in place with the 4000
    trajectory tokens (normal tokens, as Alpamayo adds them) and `markers` (special tokens; default Alpamayo
    1.5's, the release layouts pass their own)."""
    base = base_tokenizer() if base is None else base
    return extend_tokenizer(base, PlannerSettings().traj_vocab_size, markers)


def base_tokenizer() -> Any:
    """The demo base tokenizer (what a Qwen3-VL base model ships, at a small scale): Qwen2-style byte-level BPE
    trained on the built-in corpus plus the Qwen added tokens, with the Qwen3-VL-style chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS.read_text().splitlines(), trainer)
    model = json.loads(bpe.to_str())["model"]
    if len(model["vocab"]) != BPE_VOCAB_SIZE:
        raise RuntimeError(
            f"{CORPUS}: BPE training gave {len(model['vocab'])} tokens, expected {BPE_VOCAB_SIZE}"
        )
    vocab = dict(model["vocab"])
    for token, _ in QWEN_ADDED_TOKENS:
        vocab[token] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=[tuple(m) for m in model["merges"]],
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tok.add_tokens(
        [AddedToken(t, special=special, normalized=not special) for t, special in QWEN_ADDED_TOKENS]
    )
    tok.chat_template = qwen3vl_chat_template()
    return tok


def vlm_config(tokenizer: Any, vocab_size: int | None = None) -> dict[str, Any]:
    """The tiny Qwen3-VL config (hub spelling) for `tokenizer`'s special ids; `vocab_size` embedding rows
    (default: one per token)."""
    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        DEMO_TEXT,
        vocab_size=vocab_size or len(tokenizer),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": text,
        "vision_config": dict(DEMO_VISION, out_hidden_size=DEMO_TEXT["hidden_size"]),
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"),
        "vision_end_token_id": ids("<|vision_end|>"),
        "tie_word_embeddings": False,
    }


def demo_config(tokenizer: Any) -> dict[str, Any]:
    """config.json of the demo checkpoint (the project's layout) for `tokenizer`'s vocabulary."""
    planner = PlannerSettings()
    history = planner.history
    return {
        "model_type": "alpamayo_demo",
        "vlm_config": vlm_config(tokenizer),
        "traj_vocab_size": planner.traj_vocab_size,
        "tokens_per_history_traj": history.num_tokens,
        "tokens_per_future_traj": planner.tokens_per_future,
        "traj_tokenizer_cfg": future_tokenizer_fields(),
        "hist_traj_tokenizer_cfg": {
            "num_bins": history.num_bins,
            "ego_xyz_min": list(history.xyz_min),
            "ego_xyz_max": list(history.xyz_max),
            "pad_origin_at_beginning": history.pad_origin,
        },
        "action_space_cfg": action_space_fields(),
        **expert_settings(),
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "include_camera_ids": True,
        "include_frame_nums": True,
        "add_special_tokens": True,
    }


def future_tokenizer_fields() -> dict[str, Any]:
    """The default future (discrete) trajectory tokenizer as config.json fields: bins and per-dim range; every
    layout writes them."""
    future = PlannerSettings().future
    return {"num_bins": future.num_bins, "dims_min": list(future.dims_min), "dims_max": list(future.dims_max)}


def action_space_fields() -> dict[str, Any]:
    """The default action space (`planner.settings.ActionSpaceSettings`) as config.json fields, tuples as
    lists; every layout writes it."""
    return {
        k: list(v) if isinstance(v, tuple) else v for k, v in asdict(PlannerSettings().action_space).items()
    }


def expert_settings() -> dict[str, Any]:
    """The action expert's config.json fields in the project's layout: Alpamayo 1.5's flat keys
    (`alpamayo.config.expert`), without its Hydra `_target_` strings."""
    return {
        "expert_cfg": dict(EXPERT_CFG),
        "action_in_proj_cfg": dict(IN_PROJ),
        "action_out_proj_cfg": {"bias": True},
        "diffusion_cfg": dict(DIFFUSION),
        "expert_non_causal_attention": True,
    }


@torch.no_grad()
def randomize_weights(model: torch.nn.Module, seed: int) -> None:
    """Seeded re-initialisation of every parameter, in name order: norm weights 1 + 0.1 N, biases 0.05 N,
    matrices N / sqrt(fan_in). (Unit norms and zero biases, transformers' defaults, would hide a missing norm
    or bias in a golden test.)"""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        p.copy_(random_tensor(name, p.shape, g))


def random_tensor(name: str, shape: Sequence[int], g: torch.Generator) -> torch.Tensor:
    """One float32 tensor by `randomize_weights`' rule for parameter `name` (a norm weight, a bias, a matrix)."""
    shape = tuple(shape)
    if len(shape) == 1 and "norm" in name and name.endswith("weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if len(shape) == 1:
        return 0.05 * torch.randn(shape, generator=g)
    fan_in = shape[-1] if len(shape) != 5 else math.prod(shape[1:])
    return torch.randn(shape, generator=g) / math.sqrt(fan_in)


def random_weights(
    shapes: Mapping[str, Sequence[Sequence[int]]],
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> Callable[[str], torch.Tensor]:
    """A tensor getter (`TextModel.from_weights`, `DFlashDraft`): the tensor `name` of `shapes` (name -> its
    allowed shapes, the first one drawn: `text_tensor_shapes`, `draft_tensor_shapes`) drawn by `random_tensor`'s
    rule when it is asked for, in `dtype` on `device`, so a model of any size is built in memory without a
    checkpoint file or a second copy of its weights (the benchmarks at the 8B shape)."""
    g = torch.Generator().manual_seed(seed)
    return lambda name: random_tensor(name, shapes[name][0], g).to(device, dtype)


def hf_vlm(vlm_config: dict[str, Any]) -> torch.nn.Module:
    """transformers' `Qwen3VLForConditionalGeneration` for a `vlm_config` object (default-initialised, eval)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    fields = {k: v for k, v in vlm_config.items() if k not in ("architectures", "model_type")}
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(**fields)).eval()


def demo_weights(vlm_config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Random float32 VLM weights for `vlm_config`, named as on disk in an Alpamayo checkpoint (`vlm.` prefix)."""
    model = hf_vlm(vlm_config)
    randomize_weights(model, seed)
    return {f"vlm.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}


@torch.no_grad()
def expert_weights(expert: ExpertConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random float32 action-expert tensors under their on-disk names (`expert.prefixes`): transformers'
    `Qwen3VLTextModel` for the expert config without `embed_tokens` (seeded with `seed`), then the in / out
    projections (`seed + 1`)."""
    from transformers import Qwen3VLTextConfig, Qwen3VLTextModel

    text = {k: v for k, v in expert.text_dict.items() if k not in ("architectures", "model_type")}
    model = Qwen3VLTextModel(Qwen3VLTextConfig(**text)).eval()
    randomize_weights(model, seed)
    prefixes = expert.prefixes
    out = {
        f"{prefixes.expert}{k}": v.contiguous()
        for k, v in model.state_dict().items()
        if "embed_tokens" not in k
    }
    g = torch.Generator().manual_seed(seed + 1)
    for name, shape in sorted(expert.weight_shapes().items()):
        if name.startswith((prefixes.in_proj, prefixes.out_proj)):
            out[name] = random_tensor(name, shape, g)
    missing = sorted(set(expert.weight_shapes()) - set(out))
    wrong = [n for n, s in expert.weight_shapes().items() if n in out and tuple(out[n].shape) != tuple(s)]
    if missing or wrong:
        raise RuntimeError(
            f"expert weights disagree with the expert config: missing {missing}, mis-shaped {wrong}"
        )
    return out


def model_weights(
    config: dict[str, Any], vlm: dict[str, Any], source: str, seed: int
) -> tuple[dict[str, torch.Tensor], ExpertConfig]:
    """Every tensor of a demo checkpoint, float32 under its on-disk name: the VLM of Qwen3-VL config `vlm`
    (`demo_weights`, seeded `seed`) and the action expert config.json `config` describes (`expert_weights`,
    `seed + 1`); and that expert's config."""
    expert = parse_expert_config(config, vlm["text_config"], source)
    weights = demo_weights(vlm, seed)
    weights.update(expert_weights(expert, seed + 1))
    return weights, expert


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def check_output_dir(out: Path, what: str = "the demo checkpoint") -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: {what} needs a new or empty directory; this one is not empty")


def write_demo_layout(out: Path, seed: int) -> Path:
    """Write the demo checkpoint in the project's layout into `out` (checked by
    `alpamayo.demo_release.make_demo_checkpoint`, the entry point for every layout); returns `out`."""
    from safetensors.torch import save_file

    tokenizer = build_tokenizer()
    config = demo_config(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation_config(tokenizer))
    write_json(out / "preprocessor_config.json", PREPROCESSOR)
    weights, _ = model_weights(config, config["vlm_config"], str(out / "config.json"), seed)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def generation_config(tokenizer: Any) -> dict[str, Any]:
    """generation_config.json: Qwen3-VL's EOS ids (`<|im_end|>`, `<|endoftext|>`) and pad id."""
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return {"eos_token_id": eos, "pad_token_id": eos[1]}


def token_layout(tokenizer: Any, history_first: bool = False) -> list[tuple[str, int, int]]:
    """(what, first id, last id) of each contiguous block of the demo vocabulary, for notes and reports;
    `history_first`: the history bins come first among the `<iN>` (Alpamayo 2 Super)."""
    ids = tokenizer.convert_tokens_to_ids
    planner = PlannerSettings()
    blocks = [("future bins", planner.future.num_bins), ("history bins", planner.history.num_bins)]
    first = 0
    bins = []
    for what, n in reversed(blocks) if history_first else blocks:
        bins.append(
            (
                f"{what} {bin_token(first)}..{bin_token(first + n - 1)}",
                ids(bin_token(first)),
                ids(bin_token(first + n - 1)),
            )
        )
        first += n
    return [
        ("byte-level BPE (alphabet + merges)", 0, BPE_VOCAB_SIZE - 1),
        ("Qwen added tokens <|endoftext|>..</think>", ids("<|endoftext|>"), ids("</think>")),
        *bins,
        ("Alpamayo markers <|prompt_start|>..<|answer_end|>", ids("<|prompt_start|>"), ids("<|answer_end|>")),
    ]
