"""The model families a checkpoint can belong to, and how `config.json` tells them apart.

    family          config.json                                 VLM config from        tokenizer from
    qwen3-vl        architectures Qwen3VL(Moe)ForConditional..  the file itself        the checkpoint
    demo            any other config with a nested vlm_config  vlm_config             the checkpoint
    r1              AlpamayoR1 / alpamayo_r1, flat              vlm_name_or_path       base model, extended
    alpamayo1.5     Alpamayo1_5 / alpamayo1_5, flat             vlm_name_or_path       base model, extended
    super           Alpamayo2Super / alpamayo2_super + vlm_cfg  vlm_config             the checkpoint, completed

Everything that differs between families (weight prefix, token order, prompt, reasoning, sampling defaults)
is a field of `Family`, so the rest of the package asks the family instead of testing its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alpamayo.generation import Sampling

# Alpamayo's 29 `<|...|>` markers in the order its tokenizer adds them (`SPECIAL_TOKENS_KEYS`). Alpamayo 1.5
# renamed the R1 slots it no longer uses to `_padding_N`; the ids are the same in both spellings, and
# Alpamayo 2 Super keeps the R1 names ([A2-src] models/utils.py).
MARKERS_R1 = (
    "prompt_start", "prompt_end", "image_start", "image_pre_tkn", "image_end", "traj_history_start",
    "traj_history_pre_tkn", "traj_history_end", "cot_start", "cot_end", "meta_action_start", "meta_action_end",
    "traj_future_start", "traj_future_pre_tkn", "traj_future_end", "traj_history", "traj_future", "image_pad",
    "vectorized_wm", "vectorized_wm_start", "vectorized_wm_end", "vectorized_wm_pre_tkn", "route_start",
    "route_pad", "route_end", "question_start", "question_end", "answer_start", "answer_end",
)  # fmt: skip
MARKERS_1_5 = (
    "prompt_start", "prompt_end", "image_start", "_padding_0", "image_end", "traj_history_start", "_padding_1",
    "traj_history_end", "cot_start", "cot_end", "_padding_2", "_padding_3", "traj_future_start", "_padding_4",
    "traj_future_end", "traj_history", "traj_future", "image_pad", "_padding_5", "_padding_6", "_padding_7",
    "_padding_8", "route_start", "route_pad", "route_end", "question_start", "question_end", "answer_start",
    "answer_end",
)  # fmt: skip
# What R1 / 1.5 add instead of the 29 markers when `add_special_tokens` is false (`TRAJ_TOKEN`, in order).
TRAJ_MARKERS = (
    "traj_history", "traj_future", "traj_history_start", "traj_future_start", "traj_history_end",
    "traj_future_end",
)  # fmt: skip
# NVIDIA's generation settings for every released model (`sample_trajectories_from_data_with_vlm_rollout`,
# `generate_text`: top_p 0.98, temperature 0.6, top_k None).
REFERENCE_SAMPLING = Sampling(temperature=0.6, top_p=0.98)
GREEDY = Sampling()


@dataclass(frozen=True)
class Family:
    """What one model family means for loading, prompting and decoding.

    vlm_source: where the Qwen3-VL config comes from: "root" (the file is one), "vlm_config" (nested),
        "base_model" (the base model `vlm_name_or_path` names; vocabulary = the extended tokenizer's length);
    weight_prefix: prefix of every VLM tensor on disk;
    markers: marker names in the order the tokenizer adds them: to the base model's tokenizer (R1 / 1.5), or to
        the checkpoint's own where it lacks them (Super); None: the checkpoint's tokenizer is taken as it is;
    history_first: the `<iN>` tokens hold the history bins first (Super), else the future bins first;
    future_key: config key of the future (discrete) trajectory tokenizer settings;
    action_space_path: config keys leading to the action-space settings;
    camera_labels / frame_labels: "always", "never" or "config" (read `include_camera_ids` /
        `include_frame_nums`, or Super's `frame_label`);
    cot_prefill: the assistant turn starts with `<|cot_start|>` (else the prompt ends at `assistant\\n`);
    route_tokens: navigation text goes inside `<|route_start|>..<|route_end|>` (else as its own text item);
    reasoning_end: marker that ends the reasoning text (None: all of it, up to `<|traj_future_start|>`);
    vqa: the model answers `<|question_start|>..` questions (`AlpamayoVLA.ask`);
    float_pixels: its processor is given float32 images x / 255 (`do_rescale=False`) and resizes them in float
        (`vision.preprocess`, Super's helper), else uint8 images;
    driving_cameras: the PhysicalAI-AV cameras a drive's trajectory prompt shows when none are chosen (NVIDIA's
        loaders: Alpamayo's four; Super's trajectory task profile six, `input_profiles.py`);
    generation_eos: the EOS ids the reasoning masks come from the checkpoint's generation_config.json where it
        has one (else the VLM config's); Super: always its `vlm_config`'s (NVIDIA's nested VLM builds its
        generation config from it and never reads the file);
    sampling: default decoding; exact_vocab: the embedding rows must equal the tokenizer's length.
    """

    name: str
    title: str
    vlm_source: str
    weight_prefix: str
    markers: tuple[str, ...] | None
    history_first: bool = False
    future_key: str = "traj_tokenizer_cfg"
    action_space_path: tuple[str, ...] = ("action_space_cfg",)
    camera_labels: str = "config"
    frame_labels: str = "config"
    cot_prefill: bool = True
    route_tokens: bool = True
    reasoning_end: str | None = "cot_end"
    vqa: bool = False
    float_pixels: bool = False
    generation_eos: bool = True
    driving_cameras: tuple[int, ...] = (0, 1, 2, 6)
    sampling: Sampling = GREEDY
    exact_vocab: bool = False

    @property
    def uses_base_model(self) -> bool:
        return self.vlm_source == "base_model"


QWEN3_VL = Family("qwen3-vl", "Qwen3-VL (Hugging Face layout)", "root", "", None)
DEMO = Family("demo", "alpamayo-tt demo layout", "vlm_config", "vlm.", None, vqa=True)
R1 = Family(
    "r1",
    "Alpamayo 1 (R1)",
    "base_model",
    "vlm.",
    MARKERS_R1,
    camera_labels="never",  # NVIDIA's R1 helper writes images only (helper.create_message)
    frame_labels="never",
    sampling=REFERENCE_SAMPLING,
    exact_vocab=True,
)
ALPAMAYO_1_5 = Family(
    "alpamayo1.5",
    "Alpamayo 1.5",
    "base_model",
    "vlm.",
    MARKERS_1_5,
    camera_labels="always",  # the 1.5 helper labels whenever camera indices are known, whatever the config says
    frame_labels="always",
    vqa=True,
    sampling=REFERENCE_SAMPLING,
    exact_vocab=True,
)
SUPER = Family(
    "super",
    "Alpamayo 2 Super",
    "vlm_config",
    "vlm.",
    MARKERS_R1,  # `build_alpamayo2_super_tokenizer` adds what the checkpoint's tokenizer lacks, at every load
    history_first=True,
    future_key="future_traj_tokenizer_cfg",
    action_space_path=("expert_config", "action_space_cfg"),
    cot_prefill=False,
    route_tokens=False,
    reasoning_end=None,
    vqa=True,
    float_pixels=True,  # `helper.prepare_model_inputs`: images.float() / 255.0, do_rescale=False
    generation_eos=False,  # `self.vlm.generation_config`: GenerationConfig.from_model_config(vlm_config)
    driving_cameras=(0, 1, 2, 3, 5, 6),  # `DRIVING_SIX_CAMERA_FOUR_FRAME`: trajectory, meta action, grounding
    sampling=REFERENCE_SAMPLING,
)
FAMILIES = {f.name: f for f in (QWEN3_VL, DEMO, R1, ALPAMAYO_1_5, SUPER)}

# (architectures entry, model_type) of each Alpamayo release's config class.
RELEASE_IDS = {
    R1.name: ("AlpamayoR1", "alpamayo_r1"),
    ALPAMAYO_1_5.name: ("Alpamayo1_5", "alpamayo1_5"),
    SUPER.name: ("Alpamayo2Super", "alpamayo2_super"),
}


def detect_family(raw: Any) -> Family:
    """The family of a parsed `config.json` object: an Alpamayo release by `architectures` / `model_type`,
    else the project's layout when a `vlm_config` is nested, else a Hugging Face Qwen3-VL config (whose
    architecture `alpamayo.config.model` then checks, naming every known family when it fits none)."""
    archs = raw.get("architectures") or []
    archs = archs if isinstance(archs, list) else [archs]
    for name, (arch, model_type) in RELEASE_IDS.items():
        if arch in archs or raw.get("model_type") == model_type:
            return FAMILIES[name]
    return DEMO if "vlm_config" in raw else QWEN3_VL
