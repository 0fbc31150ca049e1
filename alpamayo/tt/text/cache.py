"""The text backbone's device KV cache and the rows it holds."""

from __future__ import annotations

from dataclasses import dataclass, field

from alpamayo.tt.device_io import DeviceTensor
from alpamayo.tt.text.kernels import TextKernels


@dataclass
class RowState:
    """The active rows of the cache: `lengths[b]` positions filled in row b (cache slot b), and the rope offset
    of positions after the prompt (decode position = cache index + `rope_delta`)."""

    lengths: list[int] = field(default_factory=lambda: [0])
    rope_delta: int = 0

    def reset(self) -> None:
        """No prompt: one empty row."""
        self.lengths, self.rope_delta = [0], 0


@dataclass
class DeviceKVCache:
    """The device KV cache: per layer (K, V), each [max_batch, n_kv, rows, head_dim] (slot b: row b's
    sequence) in the recipe's kv_cache dtype (rows: `TextPlan.cache_length(max_seq_len + reserve_rows)`, see
    `TTTextModel.setup_cache`)."""

    layers: list[tuple[DeviceTensor, DeviceTensor]]
    max_seq_len: int
    max_batch: int = 1

    @classmethod
    def allocate(cls, k: TextKernels, max_seq_len: int, max_batch: int, rows: int) -> DeviceKVCache:
        """Zeroed K and V of `rows` rows in each of `max_batch` slots for every layer, TILE in DRAM."""
        ttnn, t = k.ttnn, k.text_cfg
        shape = (max_batch, t.num_key_value_heads, rows, t.head_dim)

        def zeros() -> DeviceTensor:
            return ttnn.zeros(
                shape,
                dtype=k.kv_dtype,
                layout=ttnn.TILE_LAYOUT,
                device=k.device,
                memory_config=ttnn.DRAM_MEMORY_CONFIG,
            )

        layers = []
        for _ in range(t.num_hidden_layers):
            key = zeros()
            layers.append((key, zeros()))
        return cls(layers, max_seq_len, max_batch)

    def copy_slot0(self, k: TextKernels, padded: int, slots: int) -> None:
        """Slot 0's first `padded` rows (whole 128-row blocks, as a prefill wrote them) copied on the device
        into slots 1..slots-1 (through `TextKernels.fill_cache`, the prefill's own K/V write)."""
        ttnn, t = k.ttnn, k.text_cfg
        for layer in self.layers:
            for cache in layer:
                rows = ttnn.slice(cache, [0, 0, 0, 0], [1, t.num_key_value_heads, padded, t.head_dim])
                for slot in range(1, slots):
                    k.fill_cache(cache, rows, padded, batch=slot)
                k.free(rows)

    def free(self, k: TextKernels) -> None:
        for key, value in self.layers:
            k.free(key, value)
        self.layers = []
