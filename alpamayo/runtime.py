"""`AlpamayoVLA`: camera frames + ego history -> reasoning, trajectory tokens and 64 waypoints.

    vla = AlpamayoVLA.from_spec(ModelSpec(checkpoint=ckpt_dir, dtype="bfloat16"))
    prediction = vla.predict(frames, ego_history, frame_times_ns=times)   # alpamayo.prediction.Prediction
    answer = vla.ask(frames, "Is there a pedestrian?")                    # VQA (Alpamayo 1.5 / 2 Super)

One prediction: validate the inputs; ego history -> t0 frame -> 48 history tokens; vision features for every
frame (cached per (camera, start-of-frame time), so at a 10 Hz tick only each camera's newest frame is
encoded); the Alpamayo prompt with one `<|image_pad|>` per image, expanded per image grid; prefill; reasoning
until `<|traj_future_start|>` (K samples share the prefill); then the trajectory decoder:
  * `expert` (the default when the checkpoint has expert weights, as NVIDIA's releases decode): generation stops
    once `<|traj_future_start|>` is in the KV cache, and the flow-matching action expert turns noise into 64
    normalised (acceleration, curvature) pairs in a few Euler steps, reading that cache (`alpamayo.expert`);
  * `tokens`: 128 constrained trajectory tokens -> (acceleration, curvature);
then the unicycle rollout. Every stage is a span of the model's `Tracer` (`expert`, with one `expert_step`
span per Euler step).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from alpamayo.backends import (
    BackendOptions,
    check_draft,
    check_expert_settings,
    load_draft_model,
    load_expert_decoder,
)
from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import expert_config_of
from alpamayo.config.flow import DEFAULT_FLOW, FlowSettings
from alpamayo.config.loader import load_model_config, model_tokenizer
from alpamayo.config.model import ModelConfig
from alpamayo.contract import ImageFeatures, TrajectoryDecoder
from alpamayo.decoding.loop import FILLER, generate_plans
from alpamayo.decoding.speculative import first_draft
from alpamayo.drafts import Draft, DraftContext
from alpamayo.expert.decoding import ExpertDecoder, choose_decoder, unguided_prompt
from alpamayo.expert.model import ActionExpert
from alpamayo.expert.sampler import check_noise
from alpamayo.expert.weights import has_expert_weights, stored_action_statistics, validate_expert_tensors
from alpamayo.families.registry import Family
from alpamayo.generation import Sampling, TokenSampler, sample_continue
from alpamayo.model_spec import ModelSpec
from alpamayo.prediction import FRAMES_PER_CAMERA, Answer, Cancellation, EgoHistory, Prediction
from alpamayo.profiling import Tracer
from alpamayo.reproducibility.mode import compute_on_one_thread
from alpamayo.vlm import VisionLanguageModel
from planner.ego_frame import LocalHistory
from planner.pipeline import Planner
from planner.plans import GeneratedPlan
from planner.settings import PlannerConfig
from vision.preprocess import check_image_size, preprocess_images

# Cache positions are allocated in steps of this many, so a prompt that grows by a few tokens between ticks
# (route text) does not reallocate the KV cache.
CACHE_STEP = 256


def planner_config(cfg: ModelConfig) -> PlannerConfig:
    """What the planner reads of a checkpoint's config: its top-level Alpamayo keys, their file, its family and
    its text vocabulary size (planner owns this type and reads no `ModelConfig`)."""
    return PlannerConfig(cfg.extra, cfg.source, cfg.family, cfg.text.vocab_size)


# Windows of frames the FeatureCache holds per camera: a tick finds every frame of the previous window there.
CACHED_WINDOWS = 2


class FeatureCache:
    """Vision features of recent frames keyed by (camera, start-of-frame ns); the oldest entry is evicted first.

    Holds two windows' worth (2 x 4 frames per camera): a tick reuses the previous tick's three newest frames.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, int], ImageFeatures] = OrderedDict()

    @staticmethod
    def capacity_for(cameras: int) -> int:
        """Entries for `cameras` cameras: `CACHED_WINDOWS` windows of `FRAMES_PER_CAMERA` frames each."""
        return CACHED_WINDOWS * FRAMES_PER_CAMERA * cameras

    def get(self, key: tuple[int, int]) -> ImageFeatures | None:
        return self._entries.get(key)

    def put(self, key: tuple[int, int], features: ImageFeatures) -> None:
        self._entries[key] = features
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


def frames_to_encode(cameras: int, shift: int | None = None) -> int:
    """Vision forwards of one prediction of a stream of `cameras` cameras (`AlpamayoVLA._features`: one per
    frame the `FeatureCache` misses): all `FRAMES_PER_CAMERA` per camera for a first prediction (`shift`
    None), else those of a window that slid `shift` >= 1 frame periods since the previous prediction's (one
    per camera at a 10 Hz tick); the cache still holds every frame of the previous window."""
    if shift is None:
        return cameras * FRAMES_PER_CAMERA
    if shift < 1:
        raise ValueError(f"shift {shift}: a tick's window slides by >= 1 frame period")
    return cameras * min(shift, FRAMES_PER_CAMERA)


def check_frames(
    frames: Mapping[int, Sequence[np.ndarray]], frame_times_ns: Mapping[int, Sequence[int]] | None
) -> list[int]:
    """Validate the camera frames (and their times); returns the camera indices in prompt (index) order."""
    if not isinstance(frames, Mapping) or not frames:
        raise ValueError("frames must be a non-empty mapping camera index -> 4 frames (oldest first)")
    cameras = sorted(frames)
    for cam in cameras:
        if not isinstance(cam, int) or isinstance(cam, bool) or cam < 0:
            raise ValueError(f"camera keys must be integer indices >= 0, got {cam!r}")
        seq = frames[cam]
        if len(seq) != FRAMES_PER_CAMERA:
            raise ValueError(
                f"camera {cam}: expected {FRAMES_PER_CAMERA} frames (oldest first), got {len(seq)}"
            )
        for i, img in enumerate(seq):
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
                got = f"{type(img).__name__} {getattr(img, 'dtype', '')} {list(getattr(img, 'shape', []))}"
                raise ValueError(f"camera {cam} frame {i}: expected an HxWx3 uint8 RGB array, got {got}")
            try:
                check_image_size(*img.shape[:2])
            except ValueError as e:  # checked before any frame is encoded, naming the camera and frame
                raise ValueError(f"camera {cam} frame {i}: {e}") from None
    if frame_times_ns is not None:
        if sorted(frame_times_ns) != cameras:
            raise ValueError(
                f"frame_times_ns cameras {sorted(frame_times_ns)} differ from the frames' cameras {cameras}"
            )
        for cam in cameras:
            times = [int(t) for t in frame_times_ns[cam]]
            if len(times) != FRAMES_PER_CAMERA or any(b <= a for a, b in itertools.pairwise(times)):
                raise ValueError(
                    f"camera {cam}: frame_times_ns must be {FRAMES_PER_CAMERA} strictly increasing times, got {times}"
                )
    return cameras


class AlpamayoVLA:
    """The driving model of one checkpoint (implements `alpamayo.prediction.Predictor`)."""

    def __init__(
        self,
        vlm: VisionLanguageModel,
        planner: Planner,
        tracer: Tracer | None = None,
        sampling: Sampling | None = None,
        max_reasoning_tokens: int = 256,
        precision: str = "float32",
        expert: ActionExpert | TrajectoryDecoder | None = None,
        flow: FlowSettings = DEFAULT_FLOW,
        draft: Draft | None = None,
        draft_name: str = "none",
    ):
        """`expert`: the flow-matching trajectory decoder, or its torch model (None: the trajectory tokens);
        `flow` its settings when a model is given. `draft`: the speculative draft of the reasoning
        (`alpamayo.drafts.load_draft(draft_name, vlm.text)`; None: plain decoding)."""
        self.draft, self.draft_name = draft, draft_name if draft is not None else "none"
        self.vlm, self.planner = vlm, planner
        self.expert: TrajectoryDecoder | None = (
            ExpertDecoder(expert, flow) if isinstance(expert, ActionExpert) else expert
        )
        # Bounded by default: a node predicting at 10 Hz for hours records ~30 spans per prediction.
        self.tracer = tracer or Tracer(max_spans=10_000)
        vlm.trace_into(self.tracer)
        self.sampling = sampling or self.family.sampling
        self.limits = planner.limits(max_reasoning_tokens)
        self.cache = FeatureCache(capacity=0)
        self.frames_encoded = 0  # vision forwards run since construction (the frame cache's misses)
        self.precision = precision
        self._resolution: tuple[int, int] | None = None

    @classmethod
    def from_spec(
        cls,
        spec: ModelSpec,
        tracer: Tracer | None = None,
        options: BackendOptions | None = None,
        weights: Checkpoint | None = None,
        cfg: ModelConfig | None = None,
    ) -> AlpamayoVLA:
        """Load what `spec` describes (`alpamayo.model_spec`): a checkpoint directory of any family
        (`alpamayo.families`: an Alpamayo release, R1, 1.5 or 2 Super, the project's layout, or a plain
        Qwen3-VL plus trajectory vocabulary), on its backend, with its decoder, flow settings, draft, sampling
        (the family's defaults where the spec leaves them open) and reasoning cap; with `spec.reproducible`
        this process computes on one thread from here on (`alpamayo.reproducibility.mode`).

        The torch backend runs on `spec.device` in `spec.dtype`; ttnn runs the vision tower and the text
        backbone on one Blackhole p150 with the precision `spec.recipe` (K samples as K rows of one decode
        program, each in its own cache slot). Either way only frames not seen before are encoded
        (`FeatureCache`). The expert is checked against the VLM and its tensors against its config, and a
        DFlash draft against the text backbone, before any weight is read.

        `options` replaces `spec.options` (a precision recipe built in memory), `weights` serves the tensors
        instead of the directory's files and `cfg` replaces its config (as in
        `VisionLanguageModel.from_checkpoint`: `alpamayo precision` runs a recipe's rounded weights so).
        """
        if spec.checkpoint is None:
            raise ValueError("no checkpoint: the model spec names none (--checkpoint DIR)")
        options = options or spec.options
        directory = spec.checkpoint
        cfg = cfg or load_model_config(directory, spec.base_model)
        check_draft(spec.draft, cfg, options)
        if spec.reproducible:
            compute_on_one_thread()
        ckpt = weights or Checkpoint(directory, cfg.weight_prefix)
        expert_cfg = expert_config_of(cfg)
        has_weights = expert_cfg is not None and has_expert_weights(ckpt, expert_cfg)
        decoder = choose_decoder(spec.decoder, expert_cfg, has_weights, cfg.source)
        flow = spec.flow
        statistics = None
        if decoder == "expert" and expert_cfg is not None:  # choose_decoder: the expert only where described
            validate_expert_tensors(ckpt, expert_cfg, cfg.text)
            check_expert_settings(expert_cfg, flow, options)
            # R1 un-normalises the expert's actions with the statistics its checkpoint stores (bf16 in a bf16
            # release), not config.json's: `stored_action_statistics` has NVIDIA's rule.
            statistics = stored_action_statistics(ckpt, expert_cfg)
        vlm = VisionLanguageModel.from_checkpoint(directory, options, weights=ckpt, cfg=cfg)
        planner = Planner.from_config(planner_config(vlm.config), model_tokenizer(vlm.config), statistics)
        expert = None
        if decoder == "expert":  # on the VLM's device
            n = planner.settings.action_space.n_waypoints
            expert = load_expert_decoder(ckpt, cfg, options, vlm.text, flow, n)
        draft = load_draft_model(spec.draft, options, vlm.text)  # on the VLM's device
        sampling = spec.sampling(cfg.family.sampling)
        return cls(
            vlm,
            planner,
            tracer,
            sampling,
            spec.max_reasoning_tokens,
            options.precision,
            expert,
            flow,
            draft,
            spec.draft,
        )

    @property
    def decoder(self) -> str:
        """The trajectory decoder: "expert" or "tokens"."""
        return "tokens" if self.expert is None else "expert"

    @property
    def family(self) -> Family:
        """The checkpoint's model family (decides the prompt, the token order and the defaults)."""
        return self.vlm.config.family

    def model_line(self) -> str:
        """What predict, serve and replay print first: the model family and how it decodes."""
        s = self.sampling
        top_k = "all" if s.top_k is None else s.top_k
        decoding = (
            "greedy" if s.greedy else f"temperature {s.temperature:g}, top_p {s.top_p:g}, top_k {top_k}"
        )
        trajectory = "trajectory tokens"
        if self.expert is not None:
            f, weight = self.expert.settings, self.expert.record()["guidance"]
            guidance = "" if weight is None else f", navigation guidance {weight:g}"
            trajectory = f"action expert ({self.expert.steps} flow steps, noise temperature {f.temperature:g}{guidance})"
        return (
            f"model family: {self.family.title} ({self.family.name}); decoding: {decoding}; "
            f"trajectory decoder: {trajectory}"
        )

    def close(self) -> None:
        """Release device resources (the ttnn backend's traces, the device expert's tensors, the device)."""
        if self.expert is not None:
            self.expert.close()
        if self.draft is not None:
            self.draft.close()
        self.vlm.close()

    @property
    def model_resolution(self) -> tuple[int, int] | None:
        """(height, width) the last frame was resized to, None before the first prediction."""
        return self._resolution

    def reset(self) -> None:
        """Forget cached frame features (e.g. after a camera restart or a seek in a recording)."""
        self.cache.clear()

    def predict(
        self,
        frames: Mapping[int, Sequence[np.ndarray]],
        ego_history: EgoHistory,
        route: str | None = None,
        num_samples: int = 1,
        seed: int | None = None,
        frame_times_ns: Mapping[int, Sequence[int]] | None = None,
        sampling: Sampling | None = None,
        noise: np.ndarray | None = None,
        stream: str | None = None,
        cancel: Cancellation | None = None,
    ) -> Prediction:
        """See `alpamayo.prediction.Predictor`. `sampling` defaults to the model's (`self.sampling`: the
        family's unless given at construction); K > 1 samples need a temperature > 0, and with a seed the
        result is reproducible.

        With the action expert, `noise` [K, 64, 2] is its initial noise (for reproducible comparisons); without
        it the noise is drawn per sample from `seed` (stream i depends only on (seed, i); greedy decoding with
        no seed uses seed 0, so a greedy prediction stays deterministic). `stream`: the stream this
        prediction belongs to (a camera stream, a replayed drive, an eval clip), for the `previous` draft.
        `cancel`: checked between vision encodes, after the prefill, and before each decode step, verify block
        and Euler step; once set, `alpamayo.prediction.PredictionCancelled` is raised there."""
        sampling = sampling or self.sampling
        cancel = cancel or Cancellation()
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
        if num_samples > 1 and sampling.greedy:
            raise ValueError(
                f"num_samples={num_samples} with greedy decoding would repeat one sample; "
                "pass sampling=Sampling(temperature>0, top_p)"
            )
        if noise is not None and self.expert is None:
            raise ValueError(
                "an initial noise is the action expert's input; this model decodes trajectory tokens"
            )
        initial = None
        if self.expert is not None:
            if noise is not None:
                initial = check_noise(noise, num_samples, self.expert.n_tokens)
            if self.expert.settings.guidance is not None and route is None:
                raise ValueError(
                    "navigation guidance needs a route: the unguided branch is the prompt without it"
                )
        cameras = check_frames(frames, frame_times_ns)
        mark = self.tracer.mark()
        history = self.planner.history(ego_history)
        prompt = self.planner.prompt(cameras, FRAMES_PER_CAMERA, history, route)
        features = self._features(frames, frame_times_ns, prompt.images, cancel)
        ids = self.vlm.expand_image_pads(prompt.token_ids, features)
        self._ensure_cache(len(ids) + self.limits.decode_positions, num_samples)
        draft = self.draft
        capture = () if draft is None else draft.capture
        draft_ctx, first = None, []
        with self.tracer.span("prefill", tokens=len(ids)) as span:
            if draft is not None:
                image_pad = self.vlm.config.image_token_id
                draft_ctx = DraftContext([t for t in prompt.token_ids if t != image_pad], num_samples, stream)
                # the first block is verified with the prefill: on the device its rows ride in the prompt's
                # padding (compute-bound, to a multiple of 128 rows) where a verify reads every weight
                first = first_draft(
                    draft, draft_ctx, self.limits, self.planner.vocab.marker("traj_future_start")
                )
                span["drafted"] = len(first)
            logits = self.vlm.prefill_block(ids, features, first, capture)
        if draft is not None and draft_ctx is not None and capture and not draft.reads_target_context:
            # a device draft reads them where the prefill left them: no download
            draft_ctx.features = torch.cat(self.vlm.text.captured, dim=-1)
        sampler = TokenSampler.for_request(sampling, seed, num_samples)
        plans = generate_plans(
            self.vlm,
            logits,
            self.planner.vocab,
            sampler,
            self.limits,
            self.vlm.config.eos_token_ids,
            self.tracer,
            trajectory_tokens=self.expert is None,
            draft=self.draft,
            draft_context=draft_ctx,
            first_draft=first,
            cancel=cancel,
        )
        normalised = None
        if self.expert is not None:
            noise_seed = 0 if seed is None and sampling.greedy else seed
            plain = None
            if self.expert.settings.guidance is not None:
                plain = self._unguided_ids(ids, cameras, history, features)
            normalised = self._expert_actions(
                self.expert, ids, plain, features, plans, noise_seed, initial, cancel
            )
        with self.tracer.span("rollout", samples=num_samples):
            samples = self.planner.samples(plans, history, normalised)
        return Prediction(
            samples=samples,
            timings_ms=self.tracer.totals_ms(mark),
            decoder=self.decoder,
            flow=None if self.expert is None else self.expert.record(),
            draft=self.draft_name,
            accepted_lengths=[p.accepted_lengths for p in plans] if self.draft is not None else [],
        )

    def _unguided_ids(
        self, ids: list[int], cameras: Sequence[int], history: LocalHistory, features: Sequence[ImageFeatures]
    ) -> list[int]:
        """Navigation guidance's unguided prompt, expanded like `ids`: NVIDIA's 1.5 deletes the
        `<|route_start|>..<|route_end|>` span from the guided ids (`remove_nav_text`); Super's guided example
        renders the prompt again without the route (its raw route text is its own text item, which BPE merges
        with the instruction after it, so no span of the guided ids is the route)."""
        vocab = self.planner.vocab
        if self.family.route_tokens:
            return unguided_prompt(ids, vocab.marker("route_start"), vocab.marker("route_end"))
        plain = self.planner.prompt(cameras, FRAMES_PER_CAMERA, history, None)
        return self.vlm.expand_image_pads(plain.token_ids, features)

    def _expert_actions(
        self,
        decoder: TrajectoryDecoder,
        ids: list[int],
        plain: list[int] | None,
        features: Sequence[ImageFeatures],
        plans: Sequence[GeneratedPlan],
        seed: int | None,
        noise: torch.Tensor | None,
        cancel: Cancellation,
    ) -> np.ndarray:
        """The action expert's [K, 64, 2] normalised actions after `generate_plans(trajectory_tokens=False)`;
        `plain`: navigation guidance's unguided prompt (`_unguided_ids`), None without guidance."""
        vocab = self.planner.vocab
        with self.tracer.span("expert", samples=len(plans), steps=decoder.steps):
            ctx = decoder.context(self.vlm.text, len(ids), plans)
            unguided = None
            if plain is not None:
                branch = decoder.unguided
                if branch is None:  # the decoder declares that it cannot build the unguided branch
                    raise ValueError(
                        f"navigation guidance: this backend's trajectory decoder ({type(decoder).__name__}) has "
                        "no unguided branch; drop the guidance weight"
                    )
                unguided = branch(
                    self.vlm, plain, features, plans, vocab.marker("traj_future_start"), vocab.marker(FILLER)
                )
            actions = decoder.sample(ctx, seed, noise, unguided, self.tracer, cancel)
        return actions.double().cpu().numpy()

    def ask(
        self,
        frames: Mapping[int, Sequence[np.ndarray]],
        question: str,
        seed: int | None = None,
        frame_times_ns: Mapping[int, Sequence[int]] | None = None,
        sampling: Sampling | None = None,
        max_new_tokens: int = 256,
    ) -> Answer:
        """Answer `question` about the frames (VQA; Alpamayo 1.5, 2 Super and the project's layout): the
        images, `<|question_start|>question<|question_end|>`, the assistant prefilled with `<|answer_start|>`;
        tokens are drawn with `sampling` (default: the model's) until `<|answer_end|>`, an EOS id or
        `max_new_tokens` (NVIDIA's `generate_text` default, 256)."""
        if not self.family.vqa:
            raise ValueError(
                f"{self.vlm.config.source}: {self.family.title} checkpoints do not answer questions "
                "(VQA is trained into Alpamayo 1.5 and 2 Super)"
            )
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        cameras = check_frames(frames, frame_times_ns)
        mark = self.tracer.mark()
        prompt = self.planner.vqa_prompt(cameras, FRAMES_PER_CAMERA, question)
        features = self._features(frames, frame_times_ns, prompt.images)
        ids = self.vlm.expand_image_pads(prompt.token_ids, features)
        self._ensure_cache(len(ids) + max_new_tokens, 1)
        with self.tracer.span("prefill", tokens=len(ids)):
            logits = self.vlm.prefill(ids, features)
        self.vlm.fork(1)
        end = self.planner.vocab.marker("answer_end")
        sampler = TokenSampler.for_request(sampling or self.sampling, seed, 1)
        with self.tracer.span("answer_decode"):
            tokens = sample_continue(
                self.vlm, logits, sampler, max_new_tokens, [end, *self.vlm.config.eos_token_ids]
            )
        capped = len(tokens) == max_new_tokens and tokens[-1] != end
        return Answer(self.planner.answer_text(tokens), tokens, capped, self.tracer.totals_ms(mark))

    def _features(
        self,
        frames: Mapping[int, Sequence[np.ndarray]],
        frame_times_ns: Mapping[int, Sequence[int]] | None,
        order: Sequence[tuple[int, int]],
        cancel: Cancellation | None = None,
    ) -> list[ImageFeatures]:
        """Features of every (camera, frame) in prompt order; cached frames are looked up, new ones encoded
        (`cancel` is checked before each)."""
        self.cache.capacity = FeatureCache.capacity_for(len(frames))
        cancel = cancel or Cancellation()
        out = []
        for cam, i in order:
            cancel.check()
            key = None if frame_times_ns is None else (cam, int(frame_times_ns[cam][i]))
            cached = None if key is None else self.cache.get(key)
            if cached is not None:
                with self.tracer.span("vision", camera=cam, frame=i, cached=True):
                    out.append(cached)
                continue
            with self.tracer.span("preprocess", camera=cam, frame=i):
                pixels, grid = preprocess_images([frames[cam][i]], self.vlm.preprocess)
            with self.tracer.span("vision", camera=cam, frame=i, cached=False):
                (feats,) = self.vlm.encode_pixels(pixels, grid)
            self.frames_encoded += 1
            self._resolution = (
                int(grid[0, 1]) * self.vlm.preprocess.patch_size,
                int(grid[0, 2]) * self.vlm.preprocess.patch_size,
            )
            if key is not None:
                self.cache.put(key, feats)
            out.append(feats)
        return out

    def _ensure_cache(self, positions: int, rows: int) -> None:
        cache = self.vlm.text.cache
        if cache is None or cache.max_seq_len < positions or cache.max_batch < rows:
            need = -(-positions // CACHE_STEP) * CACHE_STEP
            self.vlm.setup_cache(need, max(rows, 1 if cache is None else cache.max_batch))
