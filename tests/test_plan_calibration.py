"""The expected p150 model (`alpamayo.plan.calibration`): the published measurements it is fitted to, the fit
within +-20 % of every fitted one, leave-one-out, expected >= roofline for every stage of every built-in
config and the demo checkpoint, and `alpamayo plan` printing both beside each other."""

from __future__ import annotations

import json
import re

import pytest

from alpamayo.cli import main
from alpamayo.config.builtin import EXPERT_NAMES, NAMES, builtin_config, builtin_expert
from alpamayo.errors import ConfigError
from alpamayo.plan.calibration import model as calibration_model
from alpamayo.plan.calibration.anchors import FORMAT, load_anchors, parse_anchor, write_anchors
from alpamayo.plan.calibration.model import FIT_TOLERANCE, calibration, fit, fitted
from alpamayo.plan.calibration.model import NAMES as CLASS_NAMES
from alpamayo.plan.device_spec import P150
from alpamayo.plan.estimate import (
    decode_estimate,
    dflash_draft_estimate,
    expert_estimate,
    first_block_ms,
    prefill_estimate,
    verify_estimate,
    vision_estimate,
)
from alpamayo.plan.precision import load_precision

ANCHORS = load_anchors()
BY_ID = {a.id: a for a in ANCHORS}


def test_every_anchor_names_its_published_source():
    assert ANCHORS and sum(a.fit for a in ANCHORS) >= 10
    for a in ANCHORS:
        s = a.source
        assert (s.repo and s.path and len(s.commit or "") == 40) or s.url or s.file, a.id
        assert s.date or s.file, a.id  # only the project's own seed file is undated
        assert s.where.strip(), a.id
        if s.url:
            assert s.url.startswith("https://github.com/tenstorrent/"), a.id
        if not a.fit:
            assert a.note, f"{a.id}: a reference row says why it is not fitted"


def test_the_issues_rows_are_anchors():
    """The figures issue 40 starts from, each in the file with its source."""
    ms = {a.id: a.measured_ms for a in ANCHORS}
    assert ms["llama-3.1-8b.decode.b1.force-argmax"] == pytest.approx(25.79)
    assert ms["llama-3.1-8b.decode.b1.host-sampling"] == pytest.approx(28.2)
    assert ms["llama-3.1-8b.decode.b1.v0.64"] == pytest.approx(1e3 / 34.4)  # 29.1 ms
    assert ms["llama-3.1-8b.decode.b1.full-sampling-op"] == pytest.approx(47.0)
    for op, value in {"wqkv": 0.140, "wo": 0.124, "w_gate": 0.19, "w_down": 0.175, "lm_head": 2.3}.items():
        assert ms[f"qwen3-vl-32b.decode.{op}"] == pytest.approx(value)
    assert ms["llama-3.1-8b.vllm.ttft.128"] == 174.5 and ms["llama-3.1-8b.vllm.tpot.128"] == 35.2
    assert ms["llama-3.1-8b.vllm.ttft.1024"] == 466.0 and ms["llama-3.1-8b.vllm.tpot.1024"] == 39.8
    assert ms["llama-3.1-8b.vllm.ttft-1024-minus-128"] == pytest.approx(466.0 - 174.5)


def _row(**over):
    row = {
        "id": "x",
        "workload": {"model": "qwen3-vl-2b", "recipe": "performance", "stage": "lm_head_op"},
        "measured": 1.0,
        "unit": "ms",
        "fit": True,
        "source": {"url": "https://example.org/a", "date": "2026-01-02", "where": "table 1"},
    }
    return row | over


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (_row(source={"url": "https://example.org/a", "where": "t"}), "needs its date"),
        (
            _row(source={"repo": "a/b", "path": "p", "date": "2026-01-02", "where": "t"}),
            "needs path and commit",
        ),
        (_row(source={"date": "2026-01-02", "where": "t"}), "names no repo"),
        (_row(source={"url": "u", "date": "2 Jan 2026", "where": "t"}), "is not YYYY-MM-DD"),
        (_row(source={"url": "u", "date": "2026-01-02", "where": " "}), "source.where"),
        (_row(unit="s"), "unit 's'"),
        (_row(measured=0), "positive number"),
        (_row(workload={"model": "m", "recipe": "r", "stage": "warp"}), "workload.stage 'warp'"),
        (_row(workload={"model": "m", "recipe": "r", "stage": "prefill", "tokens": 3}), "unknown workload"),
    ],
)
def test_a_malformed_row_is_refused_by_name(row, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_anchor("f.json row 0", row)


def test_rows_round_trip_through_the_file_format(tmp_path):
    path = tmp_path / "a.json"
    write_anchors(path, ANCHORS)
    again = load_anchors(path)
    assert [a.row() for a in again] == [a.row() for a in ANCHORS]
    assert json.loads(path.read_text())["format"] == FORMAT
    body = json.loads(path.read_text())
    body["anchors"].append(body["anchors"][0])
    path.write_text(json.dumps(body))
    with pytest.raises(ConfigError, match="duplicate anchor id"):
        load_anchors(path)


def test_every_fitted_anchor_is_within_the_tolerance(record_figure):
    _, checks = calibration(ANCHORS)
    for c in checks:
        if c.anchor.fit:
            assert abs(c.ratio - 1) <= FIT_TOLERANCE, f"{c.anchor.id}: modelled / measured {c.ratio:.2f}"
            assert c.left_out_ms is not None
    worst = max(abs(c.ratio - 1) for c in checks if c.anchor.fit)
    record_figure("p150 expected model: worst fitted anchor error (%)", 100 * worst)


def test_the_docstring_states_the_fitted_coefficients():
    model = fitted()
    stated = dict(re.findall(r"^    (\w+) +(?:efficiency )?([\d.]+)", calibration_model.__doc__, re.M))
    assert set(stated) == set(CLASS_NAMES)
    for name, value in stated.items():
        k = model.value(name)
        actual = {"sdpa_op": k * 1e3}.get(
            name, 1 / k if name in ("dram_matmul", "compute_matmul", "lm_head", "sdpa") else k
        )
        assert float(value) == pytest.approx(actual, abs=0.5 * 10 ** -len(value.split(".")[1])), name


def test_a_class_left_without_anchors_falls_back_to_its_roofline():
    """Leave-one-out of the one host-transfer anchor: nothing else prices host copies, so the fit without it
    predicts the roofline's nothing, and the efficiencies of classes without any anchor stay at 1."""
    without = fit([a for a in ANCHORS if a.id != "qwen3-vl-32b.logits-row-read"])
    assert without.value("host") == pytest.approx(0.0, abs=1e-6)
    bare = fit([BY_ID["qwen3-vl-32b.decode.wqkv"]])
    assert bare.value("compute_matmul") == pytest.approx(1.0, abs=1e-3)
    assert bare.value("dram_matmul") > 1.2


def _stages(cfg, expert, recipe="performance"):
    """Every stage `alpamayo plan` prices for `cfg` (and `expert`), speculative ones included."""
    p = load_precision(recipe)
    prompt, context = 1024, 1088
    out = [prefill_estimate(cfg, p, prompt, 512), decode_estimate(cfg, p, context, 64)]
    out += [verify_estimate(cfg, p, context, 8, 16), dflash_draft_estimate(cfg, p, 8, 16, context)]
    if cfg.vision is not None:
        out.append(vision_estimate(cfg, p, 4, (320, 576)))
    if expert is not None:
        out.append(expert_estimate(cfg, expert, p, 4096, 1, context))
    return out


@pytest.mark.parametrize("name", NAMES + EXPERT_NAMES + ["demo"])
def test_expected_is_at_least_the_roofline_for_every_stage(name, demo_checkpoint):
    if name == "demo":
        from alpamayo.commands.plan import resolve_config

        cfg, expert = resolve_config(str(demo_checkpoint))
    elif name in EXPERT_NAMES:
        cfg, expert = builtin_expert(name)
    else:
        cfg, expert = builtin_config(name), None
    model = fitted()
    for stage in _stages(cfg, expert):
        assert model.pass_ms(stage) >= stage.ms(P150), f"{name}: {stage.name}"
        assert model.pass_ms(stage) > 0


def test_plan_prints_calibration_and_leave_one_out(capsys, tmp_path):
    assert main(["plan", "--calibration"]) == 0
    out = capsys.readouterr().out
    fitted_rows = [a for a in ANCHORS if a.fit]
    assert f"{len(ANCHORS)} published measurements (p150_anchors.json), {len(fitted_rows)} fitted" in out
    assert "left out" in out and "leave-one-out: median error" in out
    for a in ANCHORS:
        line = next(line for line in out.splitlines() if line.strip().startswith(a.id))
        ratio = re.findall(r"  (\d+\.\d\d)  ", line)
        assert ratio, line
        if a.fit:
            assert len(ratio) == 2 and abs(float(ratio[0]) - 1) <= FIT_TOLERANCE, line
    assert "fitted coefficients" in out and "layer_traced" in out
    # a card-check's rows recalibrate the plan
    extra = tmp_path / "card.json"
    row = BY_ID["qwen3-vl-32b.decode.wqkv"].row() | {"id": "card.wqkv", "measured": 0.2}
    extra.write_text(json.dumps({"format": FORMAT, "anchors": [row]}))
    assert main(["plan", "--calibration", "--anchors", str(extra)]) == 0
    out = capsys.readouterr().out
    assert f"{len(fitted_rows) + 1} fitted" in out and "card.wqkv" in out
    assert main(["plan"]) == 2
    assert "--checkpoint is required" in capsys.readouterr().err


def test_plan_prints_expected_beside_the_roofline_for_every_stage_and_total(capsys):
    assert main(["plan", "--checkpoint", "alpamayo-1.5-10b", "--accept-len", "4"]) == 0
    out = capsys.readouterr().out
    model = fitted()
    cfg = builtin_expert("alpamayo-1.5-10b")[0]
    p = load_precision("performance")
    step = decode_estimate(cfg, p, 3136, 64)
    verify = verify_estimate(cfg, p, 3136, 8, 16)
    assert (
        re.search(r"decode step .*\n +expected +([\d.]+) ms x 64", out).group(1)
        == f"{model.pass_ms(step):.3f}"
    )
    for label in ("total per prediction:", "a stream's tick:", "model-free draft (lookup, previous):"):
        line = next(line for line in out.splitlines() if label in line)
        roof, exp = (float(x) for x in re.findall(r"(?:roofline|expected) +([\d.]+) ms \([\d.]+ Hz\)", line))
        assert exp >= roof
    plain = float(
        re.search(r"total per prediction: +roofline +[\d.]+ ms \(.*?\), expected +([\d.]+) ms", out).group(1)
    )
    free = float(re.search(r"\(lookup, previous\): roofline .*?, expected +([\d.]+) ms", out).group(1))
    first = first_block_ms(cfg, p, 3072, 7, timer=model.pass_ms)
    # the speculative estimate prices the verifies and the first block with the expected model too
    assert free == pytest.approx(
        plain - 64 * model.pass_ms(step) + first + 15 * model.pass_ms(verify), abs=0.15
    )
    assert "expected, where a stream's tick goes: by stage decode step" in out
