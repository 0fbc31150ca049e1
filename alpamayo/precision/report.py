"""What a precision recipe costs, measured on the CPU with the torch reference (`alpamayo precision`): the
report (`PrecisionReport`, its table and JSON) and `precision_report`, which plans, runs and collects it.

For each recipe (`alpamayo.precision.recipes`: the ttnn ones emulated, the torch backend's weight-only ones run)
the torch reference runs in float32 beside the unrounded model (`alpamayo.precision.reference`):

  * per-layer PCC: each decoder layer of the rounded model on the unrounded model's input to that layer (the
    layer's own error, not accumulated), over the prompt and continuation rows;
  * final-logit PCC over the continuation positions, and teacher-forced top-1 agreement: the rounded model's
    argmax against the unrounded model's own greedy continuation, fed back token by token (one causal forward
    of prompt + continuation is exactly that);
  * vision tower PCC (image embeddings and every DeepStack level) on one 320x576 frame of random pixels,
    when the model has a vision tower;
  * with a recorded drive (`alpamayo.precision.drives`): the first ticks predicted in lock step by both models:
    trajectory token agreement, the ADE between the two 6.4 s trajectories (the drift the recipe adds) and each
    model's ADE to the recorded future; and the minADE difference as `alpamayo eval` computes it for the
    drive's clip;
  * with an action expert in the checkpoint, its per-step velocity PCC and waypoint drift
    (`alpamayo.precision.expert`);
  * the memory of the recipe: a ttnn recipe's DRAM plan on one p150, a torch recipe's GPU plan;
  * with `golden` (`--golden`, needs ttnn but no card), each ttnn recipe's figures as its device programs
    compute them in the ttnn golden mode (`alpamayo.precision.golden`), in a row of their own.

No ttnn and no card are needed without `golden`. Activations stay float32, so the figures isolate the weights'
rounding; the device's bf16 activations and math fidelity add the error the device tests measure
(tests/test_tt_*_device.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from alpamayo.config.expert import expert_config_of
from alpamayo.config.loader import load_model_config
from alpamayo.config.model import ModelConfig
from alpamayo.errors import BackendUnavailable
from alpamayo.eval.clips import clip_seed, drive_clip
from alpamayo.plan.dram import plan_memory
from alpamayo.plan.gpu_memory import GpuPlan, plan_gpu_memory
from alpamayo.plan.precision import Precision, load_precision
from alpamayo.plan.programs.grid import model_name
from alpamayo.precision.drives import EVAL_SEED, drive_ticks
from alpamayo.precision.recipes import RecipeReport, evaluate_quant, evaluate_recipe
from alpamayo.precision.reference import reference
from alpamayo.precision.settings import Progress, Settings
from alpamayo.quant import QuantRecipe

F = TypeVar("F")  # a recipe's figures (a dict)


@dataclass
class PrecisionReport:
    """The comparison of every recipe on one checkpoint (and drive): `table` prints it, `to_dict` is its JSON."""

    checkpoint: str
    model: str
    settings: Settings
    drive: str | None
    recipes: list[RecipeReport]

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "model": self.model,
            "settings": asdict(self.settings),
            "drive": self.drive,
            "recipes": [asdict(r) for r in self.recipes],
        }

    def table(self) -> str:
        """The figures table (a ttnn recipe's golden-mode row under its own), then per-layer PCC, the expert's
        per-step velocity PCC, the dtypes per tensor group, and what each column means."""
        cols = self._figure_columns()
        rows = []
        for r in self.recipes:
            rows.append(self._recipe_row(r))
            if r.golden is not None:
                rows.append(_golden_row(r, cols))
        lines = [self._head(), *_columns([cols, *rows])]
        lines.append("per-layer PCC (each layer on the unrounded model's input to it):")
        lines += self._by_recipe("layer", range(len(self.recipes[0].layer_pcc)), lambda r, i: r.layer_pcc[i])
        if (expert := self.recipes[0].expert) is not None:  # `_has_expert`
            lines.append(
                f"action expert velocity PCC per Euler step (at the float32 expert's x_k; waypoint drift "
                f"rolled out at {expert['v0_mps']:.0f} m/s):"
            )
            steps = range(len(expert["velocity_pcc"]))
            lines += self._by_recipe(
                "step", steps, lambda r, k: _present(r.expert, "expert", r)["velocity_pcc"][k]
            )
        dtypes = [["group", *(r.recipe["name"] for r in self.recipes)]]
        dtypes += [
            [g, *(r.recipe["dtypes"][g] for r in self.recipes)] for g in self.recipes[0].recipe["dtypes"]
        ]
        lines.append("dtypes:")
        lines += ["  " + line for line in _columns(dtypes)]
        return "\n".join(lines + self._notes())

    def _head(self) -> str:
        s = self.settings
        head = (
            f"precision plan: {self.model}, prompt {s.prompt_tokens} + {s.tokens} greedy tokens, "
            f"memory at max_seq_len {s.max_seq_len}"
        )
        if self.drive is not None:
            ticks = _present(self.recipes[0].drive, "drive", self.recipes[0])["ticks"]
            head += f", drive {Path(self.drive).name} ({ticks} ticks)"
        return head

    def _has_expert(self) -> bool:
        return self.recipes[0].expert is not None

    def _has_min_ade(self) -> bool:
        return any(r.min_ade is not None for r in self.recipes)

    def _figure_columns(self) -> list[str]:
        cols = ["recipe", "backend", "layer PCC min", "logits PCC", "top-1", "vision PCC"]
        cols += ["traj tokens", "ADE drift m", "ADE m"] if self.drive is not None else []
        cols += ["expert v PCC min", "expert ADE drift m"] if self._has_expert() else []
        min_ade = self._has_min_ade()
        cols += [f"minADE m (K={self.settings.eval_samples})", "minADE diff m"] if min_ade else []
        return [*cols, "memory GB", "fits on"]

    def _recipe_row(self, r: RecipeReport) -> list[str]:
        row = [
            r.recipe["name"],
            r.recipe["backend"],
            f"{min(r.layer_pcc):.6f}",
            f"{r.logits_pcc:.6f}",
            f"{100 * r.top1_agreement:.1f}%",
            "-" if r.vision_pcc is None else f"{r.vision_pcc:.6f}",
        ]
        if r.drive is not None:
            row += _drive_cells(r.drive)
        if r.expert is not None:
            row += [f"{r.expert['velocity_pcc_min']:.6f}", f"{r.expert['ade_drift_m']:.3f}"]
        if self._has_min_ade():
            m = r.min_ade
            row += (
                ["-", "-"]
                if m is None
                else [f"{m['min_ade_m']:.3f} ({m['reference_m']:.3f})", f"{m['difference_m']:+.3f}"]
            )
        return [*row, f"{r.dram['total_gb']:.3f}", r.dram["fits_on"]]

    def _by_recipe(
        self, name: str, keys: Sequence[int], figure: Callable[[RecipeReport, int], float]
    ) -> list[str]:
        """An indented table of `figure` (PCC, 6 decimals) per key (a row) and recipe (a column)."""
        rows = [[name, *(r.recipe["name"] for r in self.recipes)]]
        rows += [[str(k), *(f"{figure(r, k):.6f}" for r in self.recipes)] for k in keys]
        return ["  " + line for line in _columns(rows)]

    def _notes(self) -> list[str]:
        """What the columns mean: the drive's and the eval minADE's where shown, the golden rows', the backends'."""
        s, lines = self.settings, []
        if self.drive is not None:
            lines.append(
                "ADE m: the recipe's ADE to the recorded future (the unrounded model's in parentheses)"
            )
        if self._has_min_ade():
            lines.append(
                f"minADE m: as alpamayo eval scores the drive's clip (first tick, K={s.eval_samples} samples at "
                "temperature 0.6, top-p 0.98, the clip's seed, the checkpoint's trajectory decoder): min over samples "
                "of the ADE at 6.4 s (the unrounded model's in parentheses); minADE diff m: recipe less unrounded"
            )
        if any(r.golden is not None for r in self.recipes):
            lines.append(
                "ttnn golden: the recipe's device programs run in the ttnn golden mode (ttnn's golden functions "
                "on the host, bf16 / block-float activations and K/V as on the device; alpamayo.tt.golden): "
                "logits and top-1 teacher-forced in one device prefill, the drive through --tt-mode golden."
            )
        return [
            *lines,
            "reference: the unrounded checkpoint in float32 on the CPU (torch reference).",
            "ttnn: emulated, weights rounded bit-exactly as the p150 stores them (alpamayo.plan.block_float), "
            "K/V to the recipe's kv_cache dtype, run by the torch reference in float32 (no card); memory: "
            "the p150 DRAM plan (alpamayo plan), fits on: the p150.",
            "torch: run, the torch backend's --quant linears (PyTorch's weight-only kernels "
            "_weight_int8pack_mm / _weight_int4pack_mm_for_cpu) with float32 activations on the CPU; memory: "
            f"the bfloat16 GPU plan at K={s.eval_samples} (alpamayo plan --backend torch), fits on: the "
            "smallest common GPU.",
        ]


def _present(figures: F | None, what: str, r: RecipeReport) -> F:
    """A recipe's `what` figures where the first recipe has them: every recipe runs on the same checkpoint and
    drive, so a missing one is a bug."""
    if figures is None:
        raise ValueError(f"recipe {r.recipe['name']} has no {what} figures where the first recipe has them")
    return figures


def _drive_cells(d: dict[str, float]) -> list[str]:
    """The traj tokens, ADE drift m and ADE m cells of a run's `drive_figures`."""
    ade_cell = f"{d['ade_recipe_m']:.3f} ({d['ade_reference_m']:.3f})" if "ade_recipe_m" in d else "-"
    return [f"{100 * d['token_agreement']:.1f}%", f"{d['ade_drift_m']:.3f}", ade_cell]


def _golden_row(r: RecipeReport, cols: list[str]) -> list[str]:
    """The table row of a recipe's golden-mode figures, "-" in the columns the golden mode does not fill."""
    g = r.golden or {}
    cells = {
        "recipe": r.recipe["name"],
        "backend": "ttnn golden",
        "logits PCC": f"{g['logits_pcc']:.6f}",
        "top-1": f"{100 * g['top1_agreement']:.1f}%",
        "vision PCC": "-" if g["vision_pcc"] is None else f"{g['vision_pcc']:.6f}",
    }
    if g.get("expert_ade_drift_m") is not None:
        cells["expert ADE drift m"] = f"{g['expert_ade_drift_m']:.3f}"
    if (d := g.get("drive")) is not None:
        cells.update(zip(("traj tokens", "ADE drift m", "ADE m"), _drive_cells(d), strict=True))
    return [cells.get(c, "-") for c in cols]


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def precision_report(
    directory: str | Path,
    recipes: Sequence[str | Precision],
    settings: Settings = Settings(),
    drive: str | Path | None = None,
    warn: Callable[[str], None] = print,
    layout: str | Path | None = None,
    pai_dir: str | Path | None = None,
    cameras: Sequence[int] | None = None,
    base_model: str | Path | None = None,
    progress: Progress = lambda message: None,
    quants: Sequence[str | QuantRecipe] = (),
    golden: bool = False,
) -> PrecisionReport:
    """Compare `recipes` on the checkpoint in `directory` (and on `drive`, a recorded drive: MCAP path, with a
    YAML topic `layout` where its topics are not the default ones, or `pai:CLIP[@T0_US]` with `pai_dir`); R1 / 1.5 read their base model from `base_model` where given (see
    `alpamayo.config.loader.load_model_config`). `quants`: the torch backend's weight-only recipes to
    compare too (`QuantRecipe.parse` names: int8, int4, int4-g32, ...). `golden`: the ttnn recipes' golden-mode
    figures too (`golden_figures`; needs ttnn, refused before any model runs without it)."""
    settings.validate()
    directory = Path(directory)
    precisions, quant_recipes = _recipes(recipes, quants, golden)
    cfg = load_model_config(directory, base_model)
    # planned first: a model the device layouts cannot hold (PlanError) is refused before any model runs
    plans = [plan_memory(cfg, p, settings.max_seq_len) for p in precisions]
    gpu_plans = [_gpu_plan(cfg, q, settings) for q in quant_recipes]
    ticks = drive_ticks(drive, settings.ticks, warn, layout, pai_dir, cameras) if drive is not None else []
    seed = clip_seed(drive_clip(drive).clip_id, EVAL_SEED) if drive is not None else EVAL_SEED
    ref = reference(directory, cfg, settings, ticks, progress, seed)
    reports = [
        evaluate_recipe(directory, p, plan, ref, settings, ticks, cfg.base_model, progress, seed, golden)
        for p, plan in zip(precisions, plans, strict=True)
    ]
    reports += [
        evaluate_quant(directory, cfg, q, plan, ref, settings, ticks, progress, seed)
        for q, plan in zip(quant_recipes, gpu_plans, strict=True)
    ]
    return PrecisionReport(
        str(directory), model_name(cfg), settings, None if drive is None else str(drive), reports
    )


def _recipes(
    recipes: Sequence[str | Precision], quants: Sequence[str | QuantRecipe], golden: bool
) -> tuple[list[Precision], list[QuantRecipe]]:
    """The ttnn and torch recipes to compare, loaded and checked (and `golden`'s ttnn) before any model runs."""
    precisions = [load_precision(r) for r in recipes]
    quant_recipes = [q if isinstance(q, QuantRecipe) else QuantRecipe.parse(q) for q in quants]
    if not precisions and not quant_recipes:
        raise ValueError("no recipe to compare: give --recipe and/or --quant")
    for q in quant_recipes:
        if not q.enabled:
            raise ValueError("--quant none is the reference itself; give int8, int4 or int4-gGROUP")
    if golden and precisions:
        from alpamayo.tt.device import device_unavailable_reason

        if (reason := device_unavailable_reason(mode="golden")) is not None:
            raise BackendUnavailable(f"--golden: {reason}")
    return precisions, quant_recipes


def _gpu_plan(cfg: ModelConfig, quant: QuantRecipe, settings: Settings) -> GpuPlan:
    """The torch backend's bfloat16 GPU plan of `quant` at `eval_samples` rows of `max_seq_len` positions."""
    return plan_gpu_memory(
        cfg,
        expert_config_of(cfg),
        quant,
        torch.bfloat16,
        settings.max_seq_len,
        settings.eval_samples,
        settings.prompt_tokens,
        0,
        False,
    )
