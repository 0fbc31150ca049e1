"""The planner side of one prediction, for one checkpoint: ego history -> prompt tokens, generated trajectory
tokens -> actions -> waypoints. The runtime calls, per request:

    history = planner.history(ego_history)                   # t0 ego frame, validated
    prompt = planner.prompt(cameras, 4, history, route)       # token ids, one <|image_pad|> per image
    ... VLM prefill, then alpamayo.decoding.loop.generate_plans(...) ...
    samples = planner.samples(plans, history)                 # TrajectorySample per generated plan
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from alpamayo.families.registry import DEMO, Family
from alpamayo.families.vocabulary import marker
from alpamayo.prediction import EgoHistory, TrajectorySample
from planner.action_space import UnicycleActionSpace
from planner.ego_frame import LocalHistory, to_t0_frame
from planner.plans import GeneratedPlan, PlanLimits
from planner.prompt import DrivingPrompt, PromptSettings, build_prompt, build_vqa_prompt
from planner.settings import PlannerConfig, PlannerSettings
from planner.tokenizers import FutureTokenizer, HistoryTokenizer, TrajectoryVocab


class Planner:
    """Tokenizers, action space, prompt format and trajectory vocabulary of one checkpoint."""

    def __init__(
        self,
        tokenizer: Any,
        settings: PlannerSettings | None = None,
        prompt_settings: PromptSettings | None = None,
        vocab_size: int | None = None,
        family: Family = DEMO,
        expert_statistics: Mapping[str, float] | None = None,
    ):
        """`expert_statistics`: the action-space mean and std fields (`ActionSpaceSettings` names) that
        un-normalise the action expert's output where the checkpoint stores its own (R1); else the config's."""
        settings = settings or PlannerSettings()
        self.tokenizer, self.settings, self.family = tokenizer, settings, family
        self.prompt_settings = prompt_settings or PromptSettings()
        self.vocab = TrajectoryVocab.from_tokenizer(tokenizer, settings, vocab_size, family.history_first)
        self.history_tokenizer = HistoryTokenizer(settings.history)
        self.future_tokenizer = FutureTokenizer(settings.future, settings.action_space)
        self.action_space = UnicycleActionSpace(replace(settings.action_space, **(expert_statistics or {})))
        self.added_tokens = frozenset(tokenizer.get_added_vocab())  # looked up once, not per prompt

    @classmethod
    def from_config(
        cls, cfg: PlannerConfig, tokenizer: Any, expert_statistics: Mapping[str, float] | None = None
    ) -> Planner:
        """Settings from the checkpoint's config.json (as `PlannerConfig`); token ids checked against its
        embedding table; `expert_statistics` as in `__init__`."""
        return cls(
            tokenizer,
            PlannerSettings.from_config(cfg),
            PromptSettings.from_config(cfg),
            cfg.vocab_size,
            cfg.family,
            expert_statistics,
        )

    def limits(self, max_reasoning_tokens: int = PlanLimits.max_reasoning_tokens) -> PlanLimits:
        return PlanLimits(max_reasoning_tokens, self.settings.tokens_per_future)

    def history(self, ego_history: EgoHistory) -> LocalHistory:
        return to_t0_frame(ego_history)

    def prompt(
        self, cameras: Sequence[int], frames_per_camera: int, history: LocalHistory, route: str | None = None
    ) -> DrivingPrompt:
        bins = self.history_tokenizer.encode(history.xyz)
        return build_prompt(
            self.tokenizer,
            self.vocab,
            cameras,
            frames_per_camera,
            bins,
            route,
            self.prompt_settings,
            self.added_tokens,
        )

    def vqa_prompt(self, cameras: Sequence[int], frames_per_camera: int, question: str) -> DrivingPrompt:
        """The question prompt over the same images (ends with `<|answer_start|>`)."""
        return build_vqa_prompt(
            self.tokenizer, cameras, frames_per_camera, question, self.prompt_settings, self.added_tokens
        )

    def reasoning_text(self, token_ids: Sequence[int]) -> str:
        """The chain-of-causation text, specials dropped, stripped: the reasoning tokens up to `<|cot_end|>`
        (R1 / 1.5 and the project's layouts), or all of them (Super: plain text up to `<|traj_future_start|>`,
        which the generation loop already leaves out)."""
        return self._text_until(token_ids, self.family.reasoning_end)

    def answer_text(self, token_ids: Sequence[int]) -> str:
        """A VQA answer: the generated tokens up to `<|answer_end|>`, specials dropped, stripped."""
        return self._text_until(token_ids, "answer_end")

    def _text_until(self, token_ids: Sequence[int], end_marker: str | None) -> str:
        ids = list(token_ids)
        end = self.tokenizer.convert_tokens_to_ids(marker(end_marker)) if end_marker else None
        if end in ids:
            ids = ids[: ids.index(end)]
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def samples(
        self, plans: Sequence[GeneratedPlan], history: LocalHistory, normalised: np.ndarray | None = None
    ) -> list[TrajectorySample]:
        """Each plan's actions rolled out from the t0 speed estimated from `history`. The actions are the
        plan's decoded trajectory bins, or with `normalised` [K, 64, 2] (the action expert's output, one row per
        plan) those, un-normalised."""
        v0 = self.action_space.estimate_v0(history)
        out = []
        for i, plan in enumerate(plans):
            if normalised is None:
                actions = self.future_tokenizer.decode(plan.future_bins)
            else:
                actions = self.action_space.denormalise(normalised[i])
            xyz, heading = self.action_space.rollout(actions, v0, z0=float(history.xyz[-1, 2]))
            out.append(
                TrajectorySample(
                    reasoning=self.reasoning_text(plan.reasoning_token_ids),
                    reasoning_token_ids=list(plan.reasoning_token_ids),
                    token_ids=list(plan.future_token_ids),
                    actions=actions,
                    xyz=xyz,
                    heading=heading,
                    reasoning_capped=plan.reasoning_capped,
                )
            )
        return out
