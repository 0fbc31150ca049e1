"""The full Qwen3-VL image + text model: preprocessing, vision tower, text decoder, glued by the prompt layout.

    vlm = VisionLanguageModel.from_checkpoint(ckpt_dir, BackendOptions(dtype=torch.bfloat16))
    features = vlm.encode_images(frames)                 # one ImageFeatures per image (cacheable per frame)
    ids = vlm.expand_image_pads(prompt_ids, features)    # one <|image_pad|> per image -> one per token
    vlm.setup_cache(len(ids) + max_new_tokens)
    logits = vlm.prefill(ids, features)                  # [V] float32, last prompt position
    logits = vlm.decode(next_id)

Prefill embeds the prompt, replaces the image-pad rows with the image embeddings (images in prompt order),
runs the decoder with 3-row M-RoPE positions (`alpamayo.positions`) and adds DeepStack level k to the output
of decoder layer k at the image positions. Decoding is the text model's (positions shifted by rope_delta).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from alpamayo.backends import TORCH_CPU, BackendOptions, load_text_model, load_vision_encoder
from alpamayo.checkpoint import Checkpoint
from alpamayo.config.loader import check_checkpoint, load_model_config
from alpamayo.config.model import ModelConfig
from alpamayo.contract import ImageFeatures, TextBackbone, VisionTower
from alpamayo.errors import ConfigError
from alpamayo.positions import expand_image_pads, image_token_counts, mrope_position_ids
from alpamayo.profiling import Tracer
from vision.preprocess import ImageInput, PreprocessConfig, preprocess_images

__all__ = ["ImageFeatures", "VisionLanguageModel"]


class VisionLanguageModel:
    """`.config` (ModelConfig), `.text` (the text backbone: `alpamayo.text.TextModel` or the ttnn one),
    `.vision` (`VisionEncoder` or the ttnn `TTVisionEncoder`), `.preprocess` (PreprocessConfig); the backends'
    contract is `alpamayo.contract`."""

    def __init__(self, text: TextBackbone, vision: VisionTower, preprocess: PreprocessConfig):
        self.config: ModelConfig = text.cfg
        self.text: TextBackbone = text
        self.vision: VisionTower = vision
        self.preprocess = preprocess

    @classmethod
    def from_checkpoint(
        cls,
        directory: str | Path,
        options: BackendOptions = TORCH_CPU,
        weights: Checkpoint | None = None,
        cfg: ModelConfig | None = None,
        base_model: str | Path | None = None,
    ) -> VisionLanguageModel:
        """Checkpoint directory of any family (config.json, safetensors, optional preprocessor_config.json;
        an Alpamayo config.json's top-level `min_pixels` / `max_pixels` override the latter's, as in Alpamayo).
        R1 / 1.5 take the config, tokenizer and preprocessor_config.json from their base model: `base_model`
        (a directory), else the one `vlm_name_or_path` names (`alpamayo.families.base_model`).

        `options` chooses the backend of the text backbone and the vision tower (default: torch, float32, CPU);
        with ttnn both run on the one Blackhole device. `weights` serves the tensors instead of
        the directory's files and `cfg` replaces its config.json (e.g. `alpamayo.tt.quantized.
        QuantizedCheckpoint` and its `config`: the model as a precision recipe rounds it).
        """
        cfg = cfg or load_model_config(directory, base_model)
        if cfg.vision is None or cfg.image_token_id is None:
            raise ConfigError(f"{cfg.source}: a vision-language model needs vision_config and image_token_id")
        pre = PreprocessConfig.from_checkpoint(cfg.base_model or directory).with_pixel_bounds(
            cfg.extra, cfg.source
        )
        if cfg.family.float_pixels:
            pre = pre.with_float_input(cfg.source)
        v = cfg.vision
        model_side = (v.patch_size, v.spatial_merge_size, v.temporal_patch_size)
        if (pre.patch_size, pre.merge_size, pre.temporal_patch_size) != model_side:
            raise ConfigError(
                f"{directory}: preprocessor_config.json patch/merge/temporal sizes "
                f"{(pre.patch_size, pre.merge_size, pre.temporal_patch_size)} differ from vision_config's {model_side}"
            )
        ckpt = weights or Checkpoint(directory, cfg.weight_prefix)
        check_checkpoint(ckpt, cfg)
        text = load_text_model(ckpt, cfg, options)
        try:
            vision = load_vision_encoder(ckpt, cfg, options, text)
        except BaseException:
            text.close()
            raise
        return cls(text, vision, pre)

    def close(self) -> None:
        """Release the backends' device resources (ttnn: vision weights, then the text model and its device);
        a no-op for torch."""
        self.vision.close()
        self.text.close()

    def trace_into(self, tracer: Tracer) -> None:
        """Record the backends' own stages in `tracer`: the ttnn models time device work (`tt.vision`,
        `tt.prefill_layers`, `tt.decode_trace_execute`, host<->device copies) as spans nested in the runtime's
        stages; the torch models have no finer stages than the runtime's, so they record none."""
        self.vision.trace_into(tracer)
        self.text.trace_into(tracer)

    def __enter__(self) -> VisionLanguageModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ images
    def encode_images(self, images: Sequence[ImageInput], channel_order: str = "RGB") -> list[ImageFeatures]:
        """Preprocess and encode images in one vision forward (one attention segment each); one entry per image.

        numpy images are uint8 [H, W, 3] in `channel_order` ("RGB" or "BGR"); PIL images any mode.
        """
        return self.encode_pixels(*preprocess_images(images, self.preprocess, channel_order))

    def encode_pixels(self, pixel_values: torch.Tensor, grid: torch.Tensor) -> list[ImageFeatures]:
        """Preprocessed images (`vision.preprocess.preprocess_images` output) -> one ImageFeatures per image."""
        embeds, deepstack = self.vision.encode(pixel_values, grid)
        counts = image_token_counts(grid, self.preprocess.merge_size)
        levels = [level.split(counts) for level in deepstack]
        return [
            ImageFeatures(e, tuple(level[i] for level in levels), tuple(grid[i].tolist()))
            for i, e in enumerate(embeds.split(counts))
        ]

    def expand_image_pads(self, input_ids: Sequence[int], features: Sequence[ImageFeatures]) -> list[int]:
        """One `<|image_pad|>` per image (prompt order) -> as many pads as that image has tokens."""
        return expand_image_pads(input_ids, _grids(features), self.config)

    # ------------------------------------------------------------------ generation
    def setup_cache(self, max_seq_len: int, max_batch: int = 1) -> None:
        """Static KV cache of the text backbone: `max_batch` rows of `max_seq_len` positions each."""
        self.text.setup_cache(max_seq_len, max_batch)

    def prefill_inputs(
        self, input_ids: torch.Tensor | Sequence[int], features: Sequence[ImageFeatures]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[torch.Tensor] | None]:
        """Expanded prompt ids [L] + its images' features (prompt order) -> the text backbone's prefill
        arguments: ids [L] or embeddings [L, H] with the image rows replaced, positions [3, L], the image-row
        mask [L] and the DeepStack levels."""
        ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)
        positions, _ = mrope_position_ids(ids, _grids(features), self.config)
        if not features:
            return ids, positions, None, None
        image_token = self.config.image_token_id
        if image_token is None:
            raise ConfigError(f"{self.config.source}: image features for a model without image_token_id")
        mask = ids.eq(image_token)
        embeds = self.text.embed(ids)
        image_embeds = torch.cat([f.embeds for f in features])
        expected = (int(mask.sum()), embeds.shape[-1])
        if tuple(image_embeds.shape) != expected:
            raise ValueError(
                f"image embeds have shape {list(image_embeds.shape)}, expected {list(expected)} "
                "(one row per <|image_pad|>, text hidden size)"
            )
        embeds[mask.to(embeds.device)] = image_embeds.to(embeds.device, embeds.dtype)
        deepstack = [torch.cat(level) for level in zip(*(f.deepstack for f in features), strict=True)]
        return embeds, positions, mask, deepstack

    def prefill_hidden(
        self, input_ids: torch.Tensor | Sequence[int], features: Sequence[ImageFeatures]
    ) -> torch.Tensor:
        """Run the prompt (see `prefill_inputs`) and fill the cache -> final-normed hidden [L, H]."""
        return self.text.prefill_hidden(*self.prefill_inputs(input_ids, features))

    def prefill(
        self,
        input_ids: torch.Tensor | Sequence[int],
        features: Sequence[ImageFeatures],
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """Run the prompt (see `prefill_inputs`) and fill the cache -> float32 logits [V] of its last position.
        `capture`: text layers whose outputs [L, H] are left in `text.captured` (a DFlash draft's context)."""
        return self.text.prefill(*self.prefill_inputs(input_ids, features), capture=capture)

    def prefill_block(
        self,
        input_ids: torch.Tensor | Sequence[int],
        features: Sequence[ImageFeatures],
        drafted: Sequence[int],
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """The prompt (see `prefill_inputs`) and the text token ids `drafted` after it, each at the position a
        decode step would give it -> float32 logits [len(drafted) + 1, V] of the prompt's last position and
        the drafted ones (`TextBackbone.prefill_block`); `capture` as in `prefill`."""
        return self.text.prefill_block(
            *self.prefill_inputs(input_ids, features), capture=capture, drafted=drafted
        )

    def fork(self, n: int) -> None:
        """Continue the prefilled prompt as n sequences sharing its KV cache (see `TextModel.fork`)."""
        self.text.fork(n)

    def decode(self, tokens: int | torch.Tensor) -> torch.Tensor:
        """Append one token per active cache row -> float32 logits ([V] for an int, [B, V] for ids [B])."""
        return self.text.decode(tokens)

    @property
    def lengths(self) -> list[int]:
        """Per active row, the positions filled in its cache row (`TextModel.lengths`)."""
        return self.text.lengths

    @property
    def max_verify_rows(self) -> int | None:
        """Rows x tokens one `verify` can run (the text model's; None: no bound)."""
        return self.text.max_verify_rows

    def verify(
        self, tokens: torch.Tensor, capture: Sequence[int] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Score a block of T tokens per row in one forward -> logits [B, T, V] (`TextModel.verify`)."""
        return self.text.verify(tokens, capture)

    def rollback(self, lengths: Sequence[int]) -> None:
        """Keep each row's first lengths[i] positions (`TextModel.rollback`)."""
        self.text.rollback(lengths)


def _grids(features: Sequence[ImageFeatures]) -> torch.Tensor:
    """The images' patch grids (t, h, w) as [n_images, 3] int64; [0, 3] for a text-only prompt."""
    return torch.tensor([f.grid_thw for f in features], dtype=torch.long).view(-1, 3)
