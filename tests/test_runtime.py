"""`AlpamayoVLA.predict` on the demo checkpoint: against transformers end to end, the per-frame vision cache,
shared-prefill samples, input validation and `alpamayo predict`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from alpamayo.cli import main
from alpamayo.generation import Sampling
from alpamayo.inputs import read_frames
from alpamayo.model_spec import ModelSpec
from alpamayo.prediction import EgoHistory
from alpamayo.runtime import AlpamayoVLA
from tests.hf_checkpoints import hf_image_processor, hf_plan_tokens, load_alpamayo_hf
from vision.preprocess import PreprocessConfig, preprocess_images

CAMERAS = (0, 1, 2, 6)
# 320 x 576 is Alpamayo's model resolution: already a multiple of 32 inside the demo's pixel bounds, so no
# resize happens and preprocessing equals transformers' bit for bit.
H, W = 320, 576
TICK_NS = 100_000_000


def frames_at(tick: int, seed: int = 0) -> tuple[dict[int, list[np.ndarray]], dict[int, list[int]]]:
    """The 4-frame window of every camera ending at `tick` (frame k of a camera is the same array in every
    window that contains it, as a camera stream would be)."""
    frames, times = {}, {}
    for cam in CAMERAS:
        ks = range(tick - 3, tick + 1)
        frames[cam] = [
            np.random.default_rng((seed, cam, k)).integers(0, 256, (H, W, 3), dtype=np.uint8) for k in ks
        ]
        times[cam] = [k * TICK_NS for k in ks]
    return frames, times


def straight_history(speed: float = 8.0, yaw: float = 0.3) -> EgoHistory:
    t = np.arange(16) * 0.1
    xyz = np.stack([speed * t * np.cos(yaw) + 5.0, speed * t * np.sin(yaw) - 2.0, np.full(16, 0.5)], 1)
    quat = np.tile([0.0, 0.0, np.sin(yaw / 2), np.cos(yaw / 2)], (16, 1))
    return EgoHistory(xyz=xyz, quat_xyzw=quat, t_ns=(t * 1e9).astype(np.int64))


@pytest.fixture(scope="module")
def vla(demo_checkpoint):
    """The discrete-token decoder: these tests pin its 128 trajectory tokens (against transformers, across the
    vision cache, across samples); the demo checkpoint's default, the action expert, is
    `test_predict_command_prints_64_waypoints`' and tests/test_expert_runtime.py's."""
    return AlpamayoVLA.from_spec(
        ModelSpec(checkpoint=demo_checkpoint, max_reasoning_tokens=6, decoder="tokens")
    )


def test_greedy_prediction_matches_transformers_end_to_end(vla, demo_checkpoint, record_figure):
    """Same prompt, pixels, positions and constrained greedy decoding as transformers' generate with images."""
    frames, times = frames_at(3)
    pred = vla.predict(frames, straight_history(), frame_times_ns=times)
    (sample,) = pred.samples

    planner = vla.planner
    prompt = planner.prompt(list(CAMERAS), 4, planner.history(straight_history()))
    images = [frames[c][i] for c, i in prompt.images]
    processor = hf_image_processor(vla.vlm.preprocess.min_pixels, vla.vlm.preprocess.max_pixels)
    vision = processor(images=images, return_tensors="pt")
    ids = vla.vlm.expand_image_pads(prompt.token_ids, vla.vlm.encode_images(images))
    ids = torch.tensor(ids)
    n = ids.numel()
    hf = load_alpamayo_hf(demo_checkpoint)
    cap = vla.limits.max_reasoning_tokens
    out = hf_plan_tokens(hf, ids, vision, vla.vlm.config, planner.vocab, cap, cap + 129)
    start = out.index(planner.vocab.marker("traj_future_start"))
    assert sample.reasoning_token_ids == out[:start]
    assert sample.token_ids == out[start + 1 : start + 129]
    record_figure("prompt tokens (16 images)", n)
    record_figure("greedy tokens equal to transformers", len(sample.reasoning_token_ids) + 129)
    assert sample.xyz.shape == (64, 3) and sample.heading.shape == (64,) and sample.actions.shape == (64, 2)
    assert np.isfinite(sample.xyz).all()
    assert np.allclose(pred.t_s, np.arange(1, 65) / 10)
    for stage in ("preprocess", "vision", "prefill", "reasoning_decode", "trajectory_decode", "rollout"):
        assert pred.timings_ms[stage] > 0


def test_vision_runs_once_per_new_frame(vla):
    vla.reset()
    before = vla.frames_encoded
    first = vla.predict(*_args(10))
    assert vla.frames_encoded - before == 16
    second = vla.predict(*_args(11))  # the window slid by one frame: one new frame per camera
    assert vla.frames_encoded - before == 16 + len(CAMERAS)
    vla.predict(*_args(11))
    assert vla.frames_encoded - before == 16 + len(CAMERAS)
    cached = [s for s in vla.tracer.spans if s.name == "vision" and s.args.get("cached")]
    assert len(cached) >= 12 + 16
    assert first.best.token_ids and second.best.token_ids


def _args(tick: int):
    frames, times = frames_at(tick)
    return frames, straight_history(), None, 1, None, times


def test_cached_features_give_the_same_prediction_as_fresh_ones(vla):
    frames, times = frames_at(20)
    vla.predict(frames, straight_history(), frame_times_ns=frames_at(19)[1])  # warms the cache for 17..19
    cached = vla.predict(frames, straight_history(), frame_times_ns=times)
    fresh = vla.predict(frames, straight_history())  # no times: every frame encoded
    assert cached.best.token_ids == fresh.best.token_ids
    assert np.array_equal(cached.best.xyz, fresh.best.xyz)


def test_samples_share_one_prefill_and_are_reproducible(vla):
    frames, times = frames_at(30)
    sampling = Sampling(temperature=0.8, top_p=0.95)
    before = len(vla.tracer.spans)
    a = vla.predict(
        frames, straight_history(), num_samples=3, seed=7, frame_times_ns=times, sampling=sampling
    )
    b = vla.predict(
        frames, straight_history(), num_samples=3, seed=7, frame_times_ns=times, sampling=sampling
    )
    assert len(a.samples) == 3
    assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
    assert len({tuple(s.token_ids) for s in a.samples}) > 1
    prefills = [s for s in vla.tracer.spans[before:] if s.name == "prefill"]
    assert len(prefills) == 2  # one per prediction, whatever the number of samples


def test_a_sample_is_the_same_whatever_the_number_of_samples_beside_it(vla):
    """Row r's stream is keyed by (seed, r) alone (`alpamayo.generation.row_seeds`) and its logits, K/V and
    expert steps do not depend on the rows beside it: K = 1, 2 and 3 at one seed give the same rows, byte for
    byte (tokens and waypoints)."""
    frames, times = frames_at(30)
    sampling = Sampling(temperature=0.8, top_p=0.95)
    runs = {
        k: vla.predict(
            frames, straight_history(), num_samples=k, seed=11, frame_times_ns=times, sampling=sampling
        )
        for k in (1, 2, 3)
    }
    three = runs[3].samples
    for k in (1, 2):
        for r, sample in enumerate(runs[k].samples):
            assert sample.token_ids == three[r].token_ids, (k, r)
            assert sample.xyz.tobytes() == three[r].xyz.tobytes(), (k, r)
    assert three[1].token_ids != three[0].token_ids or three[1].xyz.tobytes() != three[0].xyz.tobytes()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f, t, e: f.__setitem__(1, f[1][:3]), "camera 1: expected 4 frames"),
        (
            lambda f, t, e: f[2].__setitem__(0, f[2][0].astype(np.float32)),
            r"camera 2 frame 0: expected an HxWx3 uint8",
        ),
        (lambda f, t, e: f[0].__setitem__(1, f[0][1][..., :2]), r"camera 0 frame 1: expected an HxWx3 uint8"),
        (
            lambda f, t, e: f[6].__setitem__(3, np.zeros((2, 500, 3), np.uint8)),
            r"camera 6 frame 3: image 2x500 has aspect ratio 250\.0; at most 200 is supported",
        ),
        (
            lambda f, t, e: f[1].__setitem__(2, np.zeros((0, 576, 3), np.uint8)),
            r"camera 1 frame 2: image size must be at least 1x1 pixels, got 0x576",
        ),
        (
            lambda f, t, e: t.__setitem__(6, [4, 3, 2, 1]),
            "camera 6: frame_times_ns must be 4 strictly increasing",
        ),
        (lambda f, t, e: t.pop(0), r"frame_times_ns cameras \[1, 2, 6\] differ"),
        (lambda f, t, e: e.xyz.__setitem__((3, 0), np.nan), "nan|NaN|finite"),
        (lambda f, t, e: e.t_ns.__setitem__(5, 0), "increas"),
    ],
)
def test_bad_inputs_are_rejected_with_precise_errors(vla, mutate, message):
    frames, times = frames_at(40)
    ego = straight_history()
    mutate(frames, times, ego)
    before = vla.frames_encoded
    with pytest.raises(ValueError, match=message):
        vla.predict(frames, ego, frame_times_ns=times)
    assert vla.frames_encoded == before  # refused before any frame was encoded


@pytest.mark.cuda
def test_cuda_prediction_equals_the_cpu_one(vla, demo_checkpoint):
    """`device="cuda"` (float32): the same greedy tokens as on the CPU, and K samples sharing one prefill on the
    device reproduce for a seed."""
    frames, times = frames_at(50)
    expected = vla.predict(frames, straight_history(), frame_times_ns=times)
    cuda = AlpamayoVLA.from_spec(
        ModelSpec(checkpoint=demo_checkpoint, device="cuda", max_reasoning_tokens=6, decoder="tokens")
    )
    pred = cuda.predict(frames, straight_history(), frame_times_ns=times)
    assert pred.best.reasoning_token_ids == expected.best.reasoning_token_ids
    assert pred.best.token_ids == expected.best.token_ids
    assert np.allclose(pred.best.xyz, expected.best.xyz)
    sampling = Sampling(temperature=0.8, top_p=0.95)
    a, b = (cuda.predict(frames, straight_history(), None, 3, 7, times, sampling) for _ in range(2))
    assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]


def test_greedy_cannot_draw_several_samples(vla):
    frames, times = frames_at(40)
    with pytest.raises(ValueError, match="would repeat one sample"):
        vla.predict(frames, straight_history(), num_samples=2, frame_times_ns=times)


def write_prediction_inputs(directory, frames, times, ego: EgoHistory) -> None:
    """`alpamayo predict`'s input files in `directory`: frames/<camera>/<time ns>.png and ego.csv."""
    for cam, seq in frames.items():
        (directory / "frames" / str(cam)).mkdir(parents=True)
        for img, t in zip(seq, times[cam], strict=True):
            Image.fromarray(img).save(directory / "frames" / str(cam) / f"{t:012d}.png")
    rows = ["t_ns,x,y,z,qx,qy,qz,qw"] + [
        ",".join(map(str, [int(t), *p, *q])) for t, p, q in zip(ego.t_ns, ego.xyz, ego.quat_xyzw, strict=True)
    ]
    (directory / "ego.csv").write_text("\n".join(rows) + "\n")


def predict_argv(checkpoint: Path, directory: Path) -> list[str]:
    """`alpamayo predict` on the inputs `write_prediction_inputs` wrote to `directory`, 4 reasoning tokens at
    most."""
    frames, ego = str(directory / "frames"), str(directory / "ego.csv")
    return [
        "predict",
        "--checkpoint",
        str(checkpoint),
        "--frames",
        frames,
        "--ego",
        ego,
        "--max-reasoning-tokens",
        "4",
    ]


def test_predict_command_prints_64_waypoints(demo_checkpoint, tmp_path, capsys):
    """The demo checkpoint carries an action expert, so it decodes by default (no trajectory tokens);
    `--decoder tokens` gives the 128 discrete tokens after the same reasoning."""
    frames, times = frames_at(5)
    write_prediction_inputs(tmp_path, frames, times, straight_history())
    args = predict_argv(demo_checkpoint, tmp_path)
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (sample,) = out["samples"]
    assert out["decoder"] == "expert" and out["flow"]["steps"] == 10
    assert len(sample["xyz"]) == 64 and sample["trajectory_token_ids"] == []
    assert np.isfinite(sample["xyz"]).all()
    assert out["t_s"][0] == 0.1 and out["t_s"][-1] == 6.4
    assert main([*args, "--json", "--decoder", "tokens"]) == 0
    tokens = json.loads(capsys.readouterr().out)
    (discrete,) = tokens["samples"]
    assert tokens["decoder"] == "tokens" and len(discrete["trajectory_token_ids"]) == 128
    assert discrete["reasoning_token_ids"] == sample["reasoning_token_ids"]
    assert main(args) == 0
    text = capsys.readouterr().out
    reasoning = len(sample["reasoning_token_ids"])
    assert 1 <= reasoning <= 4
    assert f"sample 0: reasoning ({reasoning} tokens" in text and text.count("\n") > 64
    (tmp_path / "frames" / "6" / f"{times[6][0]:012d}.png").write_bytes(b"not an image")
    assert main(args) == 2
    assert "cannot decode image" in capsys.readouterr().err


def test_frame_files_with_transparency_reach_the_model_as_transformers_reads_them(tmp_path):
    """`alpamayo predict` reads an RGBA PNG into the pixels transformers' image processor makes of the file
    (transparency over white), not the colour under a transparent pixel."""
    rgba = np.random.default_rng(0).integers(0, 256, (64, 96, 4), dtype=np.uint8)
    (tmp_path / "0").mkdir()
    for k in range(4):
        Image.fromarray(rgba, "RGBA").save(tmp_path / "0" / f"{k}.png")
    frames, times = read_frames(tmp_path)
    assert times == {0: [0, 1, 2, 3]}
    cfg = PreprocessConfig(min_pixels=32 * 32, max_pixels=1 << 20)
    ours, _ = preprocess_images(frames[0][:1], cfg)
    with Image.open(tmp_path / "0" / "0.png") as image:
        expected = hf_image_processor(cfg.min_pixels, cfg.max_pixels)(images=[image], return_tensors="pt")
    assert torch.equal(ours, expected["pixel_values"])
