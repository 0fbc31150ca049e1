"""Decoding over a prefilled model: what one prediction's K samples generate after the prompt.

    loop         the reasoning and trajectory-token loop (`generate_plans`)
    speculative  speculative decoding of the reasoning: the first draft, the block size, verification and
                 acceptance, the rollback (`first_draft`, `speculate`; what the target must do is
                 `alpamayo.contract.SpeculativeLM`)
    draft        the one interface every speculative draft implements (`Draft`, `DraftContext`)

Each row's tokens are drawn by `alpamayo.generation.TokenSampler` (below this package: the model families take
their default `Sampling` from it), so plain and speculative decoding draw the same tokens. What it yields per
sample is `planner.plans`' `GeneratedPlan`, within `PlanLimits`.
"""
