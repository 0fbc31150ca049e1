"""The type check: mypy, as pyproject.toml's [tool.mypy] configures it, finds no error in the backend contract
(`alpamayo.contract`), its loaders (`alpamayo.backends`, whose returns bind each torch and ttnn implementation
to its protocol), the VLM, the runtime and the models that implement it; and the same check rejects an
implementation that drifts from the contract."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api as mypy_api  # the dev extra's

ROOT = Path(__file__).resolve().parents[1]


def run_mypy(*files: str) -> tuple[str, int]:
    """mypy with the project's config from the repository root (its cache: .mypy_cache there); `files`
    replace the config's list. -> (report, exit status)."""
    stdout, stderr, status = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml"), *files])
    return stdout + stderr, status


def test_the_contract_and_both_backends_type_check(monkeypatch):
    monkeypatch.chdir(ROOT)
    report, status = run_mypy()
    assert status == 0, report


DRIFTED = '''
from collections.abc import Sequence

import torch

from alpamayo.contract import TextBackbone, TrajectoryDecoder, VisionTower
from alpamayo.text import TextModel
from alpamayo.tt.text import TTTextModel
from vision.encoder import VisionEncoder


class WrongEncode:
    """A vision tower whose `encode` returns the embeddings alone."""

    def encode(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        return pixel_values

    def trace_into(self, tracer: object) -> None:
        pass

    def close(self) -> None:
        pass


def tower() -> VisionTower:
    return WrongEncode()


def backbone(model: VisionEncoder) -> TextBackbone:
    return model


def decoder(model: TTTextModel) -> TrajectoryDecoder:
    return model


def fine(model: TextModel, device: TTTextModel) -> Sequence[TextBackbone]:
    return [model, device]
'''


def test_the_check_rejects_what_breaks_the_contract(monkeypatch, tmp_path):
    """A tower with the wrong `encode`, a vision tower as a text backbone, a text backbone as a trajectory
    decoder: three protocol errors, and none where both real backbones are bound to `TextBackbone`."""
    monkeypatch.chdir(ROOT)
    snippet = tmp_path / "drifted.py"
    snippet.write_text(textwrap.dedent(DRIFTED))
    report, status = run_mypy(str(snippet))
    assert status == 1, report
    errors = [line for line in report.splitlines() if ": error:" in line]
    lines = sorted(int(line.split(":")[1]) for line in errors)
    source = snippet.read_text().splitlines()
    assert [source[n - 1].strip() for n in lines] == [
        "return WrongEncode()",
        "return model",
        "return model",
    ], report
    for got, expected in (("WrongEncode", "VisionTower"), ("VisionEncoder", "TextBackbone")):
        assert f'(got "{got}", expected "{expected}")' in report, report
        assert f'Following member(s) of "{got}" have conflicts' in report, report
    assert '(got "TTTextModel", expected "TrajectoryDecoder")' in report, report
