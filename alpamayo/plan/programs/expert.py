"""Plan of the flow-matching action expert's Euler step on the device (`alpamayo.tt.expert`; pure Python: no
ttnn, no device).

`plan_expert` plans the step beside the VLM's KV cache (see `ExpertPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from alpamayo.config.expert import ExpertConfig, validate_against_vlm
from alpamayo.config.model import ModelConfig
from alpamayo.plan.device_spec import P150, TILE, DeviceSpec, round_up
from alpamayo.plan.expert_weights import EXPERT_BANKS
from alpamayo.plan.precision import Precision
from alpamayo.plan.programs.grid import (
    PREFILL_MAX_GRID,
    SDPA_DECODE_K_CHUNK,
    TRACE_BYTES_FIXED,
    TRACE_BYTES_PER_LAYER,
    CoreGrid,
    PlanError,
    device_grid,
    flash_decode_cores,
    model_name,
)
from alpamayo.plan.programs.text import BLOCK_SDPA_POSITIONS, TextPlan, check_dims
from alpamayo.plan.weights import padded_hidden
from alpamayo.prediction import FUTURE_STEPS

# Alpamayo samples up to 16 trajectories per prediction (1.5 README: K = 16 in ~40 GB on an H100); one p150
# holds the 16 x 64 rows' activations and K/V region easily (alpamayo.plan.dram).
MAX_EXPERT_SAMPLES = 16


@dataclass(frozen=True)
class ExpertPlan:
    """The action expert's Euler step on the device (prefill-style: all 64 x K action rows at once).

    The K samples' action rows form one [1, 1, rows, H_p] stream; sample b reads cache slot b (the text
    model's K rows decode as K slots, each at its own length). Each layer writes sample b's 64 K/V rows into
    slot b of the VLM cache at the fixed tile-aligned rows [region_start, region_start + region_rows) behind
    every prompt position (`TextPlan.cache_length(max_seq_len + 64)` rows per slot), so the captured step
    never depends on the prompt lengths. Sample b attends non-causally to columns [0, offset_b) of slot b
    plus its own region. NVIDIA's expert appends its K/V to the cache and crops them away again, which is the
    same computation.

    The attention is one paged flash-decode over the cache in place (`TTActionExpert._attend`), not a
    prefill-style SDPA: that one parallelizes over slots, heads and 32-row Q chunks only, 32 work units at
    K = 1 (16 heads x 2 chunks) on a 110-core grid, compute-bound at 1.42 ms a step against 0.51 ms of K/V
    reads (`alpamayo plan`, Alpamayo 1.5). Flash-decode splits the keys over cores too. Its users are the K
    slots' K/V heads (`users`), each a query of `q_tiles` tiles: the 64 action rows of the `group` query
    heads that K/V head serves (head-major: q [K, n_heads, 64, hd] read as [1, users, 64 x group, hd], the
    same tiles in order), every tile at the same causal bound (`spec_multi_pos_tiles`, one `cur_pos` per
    tile). The cache is read as pages of `region_rows` rows of one K/V head ([K x n_kv x pages, 1,
    region_rows, hd], the same tiles in order) and each user's page table (`page_table`) lists its own
    region's page first, then the slot's pages in order: its visible keys are then the logical positions
    [0, region_rows + offset), which the causal bound `cur_pos(offset)` cuts exactly, so no mask is read and
    the prefix's stale tail (the rest of its last page) lies past the bound. Softmax attention does not
    depend on the order of its keys. Only those positions' K chunks are read (`attended_rows`)."""

    samples: int
    rows: int  # action rows per step: FUTURE_STEPS x samples, whole tiles
    hidden_padded: int
    cache_rows: int  # rows of each layer's K / V per cache slot, expert region included
    region_start: int
    region_rows: int  # one sample's action rows, kept behind max_seq_len in every slot (one page)
    kv_heads: int
    group: int  # query heads per K/V head
    grid: CoreGrid  # the matmuls'
    sdpa_grid: CoreGrid  # the attention's: the whole device grid
    k_chunk: int
    trace_region_bytes: int

    @property
    def pages(self) -> int:
        """Pages of `region_rows` rows per slot and K/V head (the page table's width)."""
        return self.cache_rows // self.region_rows

    @property
    def users(self) -> int:
        """Flash-decode users: every slot's K/V heads."""
        return self.samples * self.kv_heads

    @property
    def q_tiles(self) -> int:
        """Query tiles per user: the 64 action rows of each of its `group` query heads."""
        return self.region_rows * self.group // TILE

    def page_table(self) -> list[list[int]]:
        """[users] rows of `pages` physical pages: user s x n_kv + g (slot s, K/V head g) reads its own
        region's page, then pages 0, 1, ... of its slot and head (the region's page last among them, never
        reached: the causal bound stops at max_seq_len)."""
        own = self.region_start // self.region_rows
        return [
            [base + own, *(base + j for j in range(self.pages - 1))]
            for base in (u * self.pages for u in range(self.users))
        ]

    def cur_pos(self, offset: int) -> int:
        """The causal bound (last visible logical key) of a sample at `offset`: its own region, then the
        prefix rows [0, offset) (0: an idle slot, its own region only)."""
        return self.region_rows + offset - 1

    def attended_rows(self, offset: int) -> int:
        """Cache rows per layer, K and V each, the attention reads for a sample at `offset`: its logical
        positions in whole K chunks."""
        return min(round_up(self.region_rows + offset, self.k_chunk), self.cache_rows)

    def describe(self) -> list[str]:
        return [
            f"expert step: {self.samples} sample(s) x {FUTURE_STEPS} action rows = {self.rows} rows, residual "
            f"{self.hidden_padded} wide, minimal_matmul on {self.grid}",
            f"expert attention: paged flash-decode over the VLM cache in place, sample b in slot b "
            f"({self.cache_rows} rows per layer and slot; own K/V at rows {self.region_start}.."
            f"{self.region_start + self.region_rows - 1}, read first), {self.users} users (slots x K/V heads) "
            f"of {self.q_tiles} query tiles on {self.sdpa_grid}, {flash_decode_cores(self.sdpa_grid, self.users)} "
            f"cores busy, k_chunk {self.k_chunk}; step trace region {self.trace_region_bytes / 2**20:.0f} MiB",
        ]


def expert_rows(samples: int) -> int:
    """Action rows of one Euler step for `samples` samples (one 64-row block each)."""
    return round_up(FUTURE_STEPS * samples, TILE)


def plan_expert(
    cfg: ModelConfig,
    expert: ExpertConfig,
    precision: Precision,
    max_seq_len: int,
    samples: int = 1,
    device: DeviceSpec = P150,
) -> ExpertPlan:
    """Plan the action expert of `cfg` beside its VLM's KV cache of `max_seq_len` positions; PlanError when
    the device layout cannot hold it (ConfigError when the expert does not fit the VLM at all)."""
    source = model_name(cfg)
    validate_against_vlm(expert, cfg.text)
    t = expert.text
    if t.moe is not None:
        raise PlanError(f"{source}: the action expert has MoE layers; the ttnn expert runs dense layers only")
    check_dims(t, EXPERT_BANKS, f"{source} (action expert)")
    if t.hidden_size % TILE or expert.in_proj.hidden_size % TILE:
        raise PlanError(
            f"{source}: the action expert's hidden_size {t.hidden_size} and in-projection hidden_size "
            f"{expert.in_proj.hidden_size} must be multiples of {TILE}: its LayerNorm and RMSNorms average "
            "over whole tiles"
        )
    if not 1 <= samples <= MAX_EXPERT_SAMPLES:
        raise PlanError(
            f"samples = {samples}: the device expert runs 1..{MAX_EXPERT_SAMPLES} samples per batch"
        )
    rows, region = expert_rows(samples), expert_rows(1)
    cache_rows = TextPlan.cache_length(max_seq_len + region)
    group = t.num_attention_heads // t.num_key_value_heads
    if region * group // TILE > BLOCK_SDPA_POSITIONS:
        raise PlanError(
            f"{source}: the action expert has {group} query heads per K/V head; its attention runs one K/V "
            f"head's {region} x {group} query rows as at most {BLOCK_SDPA_POSITIONS} tiles of one flash-decode "
            f"user (L1), so at most {BLOCK_SDPA_POSITIONS * TILE // region} query heads per K/V head"
        )
    sdpa_grid = CoreGrid(device.grid_x, device.grid_y)
    if samples * t.num_key_value_heads > sdpa_grid.cores:
        raise PlanError(
            f"samples = {samples}: the expert's attention runs a flash-decode user per slot and K/V head, "
            f"{samples} x {t.num_key_value_heads} of them on {sdpa_grid.cores} cores; at most "
            f"{sdpa_grid.cores // t.num_key_value_heads} samples"
        )
    return ExpertPlan(
        samples=samples,
        rows=rows,
        hidden_padded=padded_hidden(t, EXPERT_BANKS),
        cache_rows=cache_rows,
        region_start=cache_rows - region,
        region_rows=region,
        kv_heads=t.num_key_value_heads,
        group=group,
        grid=CoreGrid(*device_grid(device, PREFILL_MAX_GRID)),
        sdpa_grid=sdpa_grid,
        k_chunk=SDPA_DECODE_K_CHUNK,
        trace_region_bytes=TRACE_BYTES_PER_LAYER * t.num_hidden_layers + TRACE_BYTES_FIXED,
    )
