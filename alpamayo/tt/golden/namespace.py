"""`GoldenTTNN`: the `ttnn` module as the golden mode's models see it.

Every op the ttnn backend calls is here, and nothing else (an op the product starts calling fails loudly
with "no golden-mode implementation" until it is added). Each op

* takes `GoldenTensor`s (checked: on the device, not deallocated, memory configs that fit them:
  `alpamayo.tt.golden.checks`),
* runs Tenstorrent's golden function (`ttnn.get_golden_function(op)`) on their values in float32, or ours
  (`alpamayo.tt.golden.ops`, `OWN_OPS`) for the ops without one,
* and returns `GoldenTensor`s whose values are rounded to the op's output dtype through ttnn's host packing,
  with the shape, layout and memory config the op gives (as the dry run reports them, `tests/
  test_tt_golden_dryrun.py`).

Config objects (memory, shard, program and compute-kernel configs), dtypes, layouts and enums are ttnn's own
(`PASS_THROUGH`): the product builds them as on a card. Compute-kernel configs (math fidelity, fp32
accumulation) do not change the numbers here: every op computes in float32 on exact device values and rounds
once into its output dtype.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from functools import partialmethod
from typing import Any

import torch

from alpamayo.plan.device_spec import TILE
from alpamayo.tt.golden import checks, ops
from alpamayo.tt.golden.tensor import GoldenTensor, host_dtype, is_block_float, stored, tile_padded

# ttnn names the golden mode hands through unchanged: types, constants, enums and config constructors.
PASS_THROUGH = frozenset(
    {
        "bfloat16",
        "bfloat8_b",
        "bfloat4_b",
        "float32",
        "int32",
        "uint32",
        "uint16",
        "DataType",
        "Layout",
        "ROW_MAJOR_LAYOUT",
        "TILE_LAYOUT",
        "DRAM_MEMORY_CONFIG",
        "L1_MEMORY_CONFIG",
        "L1_WIDTH_SHARDED_MEMORY_CONFIG",
        "L1_HEIGHT_SHARDED_MEMORY_CONFIG",
        "MemoryConfig",
        "TensorMemoryLayout",
        "BufferType",
        "ShardSpec",
        "ShardOrientation",
        "ShardStrategy",
        "CoreCoord",
        "CoreGrid",
        "CoreRange",
        "CoreRangeSet",
        "Shape",
        "StorageType",
        "UnaryOpType",
        "GeluVariant",
        "MathFidelity",
        "WormholeComputeKernelConfig",
        "MatmulMultiCoreReuseMultiCast1DProgramConfig",
        "MatmulMultiCoreReuseMultiCastDRAMShardedProgramConfig",
        "MinimalMatmulConfig",
        "LayerNormShardedMultiCoreProgramConfig",
        "SDPAProgramConfig",
        "create_sharded_memory_config",
        "num_cores_to_corerangeset",
        "device",
        "ttnn_dtype_to_torch_dtype",
    }
)

# The ops that run on our own torch implementations (no golden function in ttnn 0.81.1, or, for the last,
# an argument its golden function ignores); every other op runs on Tenstorrent's golden function.
OWN_OPS = (
    "experimental.minimal_matmul",
    "experimental.nlp_create_qkv_heads",
    "experimental.nlp_create_qkv_heads_decode",
    "experimental.nlp_concat_heads",
    "experimental.nlp_concat_heads_decode",
    "experimental.rotary_embedding_hf",
    "experimental.paged_update_cache",
    "experimental.fast_reduce_nc",
    "transformer.paged_scaled_dot_product_attention_decode[spec_multi_pos_tiles]",
)


class _Space:
    """A ttnn sub-module (`ttnn.experimental`, `ttnn.transformer`) of golden ops."""

    def __init__(self, name: str, functions: dict[str, Callable[..., Any]]):
        self._name = name
        self.__dict__.update(functions)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"ttnn.{self._name}.{name} has no golden-mode implementation")


class GoldenTTNN:
    """The golden mode's `ttnn` (see the module docstring); `real` is the imported ttnn module.

    `calls` counts the ops run, by name (ours as in `OWN_OPS`)."""

    def __init__(self, real: Any):
        self._ttnn = real
        self.calls: Counter[str] = Counter()
        self._goldens: dict[str, Callable[..., Any]] = {}
        self.experimental = _Space(
            "experimental",
            {
                "minimal_matmul": self._minimal_matmul,
                "nlp_create_qkv_heads": self._nlp_create_qkv_heads,
                "nlp_create_qkv_heads_decode": self._nlp_create_qkv_heads_decode,
                "nlp_concat_heads": self._nlp_concat_heads,
                "nlp_concat_heads_decode": self._nlp_concat_heads_decode,
                "rotary_embedding_hf": self._rotary_embedding_hf,
                "paged_update_cache": self._paged_update_cache,
                "fast_reduce_nc": self._fast_reduce_nc,
            },
        )
        self.transformer = _Space(
            "transformer",
            {
                "scaled_dot_product_attention": self._sdpa,
                "scaled_dot_product_attention_decode": self._sdpa_decode,
                "paged_scaled_dot_product_attention_decode": self._paged_sdpa_decode,
            },
        )

    def __getattr__(self, name: str) -> Any:
        if name in PASS_THROUGH:
            return getattr(self._ttnn, name)
        raise AttributeError(f"ttnn.{name} has no golden-mode implementation")

    # ------------------------------------------------------------------ plumbing
    def _golden(self, name: str) -> Callable[..., Any]:
        """Tenstorrent's golden function of `ttnn.<name>` (dotted for sub-modules)."""
        if name not in self._goldens:
            op: Any = self._ttnn
            for part in name.split("."):
                op = getattr(op, part)
            self._goldens[name] = self._ttnn.get_golden_function(op)
        return self._goldens[name]

    def _value(self, t: Any, op: str, on_device: bool = True) -> Any:
        """The value of a tensor argument (float32 or int64) after the checks every op makes; other
        arguments as they are (lists and tuples element-wise)."""
        if isinstance(t, GoldenTensor):
            if t.freed:
                raise RuntimeError(f"golden mode: {op} read a deallocated tensor {t}")
            if on_device and t.device is None:
                raise RuntimeError(f"golden mode: {op} needs device tensors, got a host tensor {t}")
            return t.value
        if isinstance(t, (list, tuple)) and any(isinstance(x, GoldenTensor) for x in t):
            return type(t)(self._value(x, op, on_device) for x in t)
        return t

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Tenstorrent's golden function of `name` on the values of `args` and `kwargs`."""
        self.calls[name] += 1
        values = [self._value(a, name) for a in args]
        kw = {k: self._value(v, name) for k, v in kwargs.items()}
        return self._golden(name)(*values, **kw)

    def _own(self, name: str) -> None:
        self.calls[name] += 1

    def _out(
        self,
        value: torch.Tensor,
        like: GoldenTensor,
        dtype: Any = None,
        layout: Any = None,
        mem: Any = None,
        padded: tuple[int, ...] | None = None,
    ) -> GoldenTensor:
        """An op's output on `like`'s device: dtype, layout and memory config default to `like`'s; the value
        is rounded to the dtype; a sharded memory config is checked against the output."""
        out = GoldenTensor(
            self._ttnn,
            value,
            dtype if dtype is not None else like.dtype,
            layout if layout is not None else like.layout,
            mem if mem is not None else like.mem,
            like.device,
            padded,
        )
        if out.device is not None:
            checks.placement(self._ttnn, out)
        return out

    # ------------------------------------------------------------------ host <-> device, allocation
    def from_torch(
        self,
        tensor: torch.Tensor,
        dtype: Any = None,
        layout: Any = None,
        device: Any = None,
        memory_config: Any = None,
        **_: Any,
    ) -> GoldenTensor:
        ttnn = self._ttnn
        if dtype is None:
            dtype = {torch.float32: ttnn.float32, torch.int32: ttnn.int32}.get(tensor.dtype, ttnn.bfloat16)
        layout = layout or ttnn.ROW_MAJOR_LAYOUT
        if is_block_float(ttnn, dtype) and layout != ttnn.TILE_LAYOUT:
            raise RuntimeError(f"golden mode: {dtype} is a tile format; from_torch got {layout}")
        self.calls["from_torch"] += 1
        value = self._golden("from_torch")(tensor.detach().cpu(), dtype, layout=layout)
        mem = (memory_config or ttnn.DRAM_MEMORY_CONFIG) if device is not None else None
        out = GoldenTensor(ttnn, value, dtype, layout, mem, device)
        if device is not None:
            checks.placement(ttnn, out)
        return out

    def to_torch(self, tensor: GoldenTensor, **_: Any) -> torch.Tensor:
        """A host or device tensor's values as `ttnn.to_torch` returns them (its dtype's torch dtype)."""
        self.calls["to_torch"] += 1
        value = self._golden("to_torch")(self._value(tensor, "to_torch", on_device=False))
        return value.to(host_dtype(self._ttnn, tensor.dtype)).clone()

    def to_device(self, tensor: GoldenTensor, device: Any, memory_config: Any = None) -> GoldenTensor:
        if tensor.device is not None:
            raise RuntimeError(f"golden mode: to_device of a tensor already on the device {tensor}")
        value = self._run("to_device", self._value(tensor, "to_device", on_device=False))
        out = GoldenTensor(
            self._ttnn,
            value.clone(),
            tensor.dtype,
            tensor.layout,
            memory_config or self._ttnn.DRAM_MEMORY_CONFIG,
            device,
            exact=True,
        )
        checks.placement(self._ttnn, out)
        return out

    def from_device(self, tensor: GoldenTensor) -> GoldenTensor:
        value = self._run("from_device", tensor)
        return GoldenTensor(self._ttnn, value.clone(), tensor.dtype, tensor.layout, exact=True)

    def allocate_tensor_on_device(
        self, shape: Any, dtype: Any, layout: Any, device: Any, memory_config: Any = None
    ) -> GoldenTensor:
        """Uninitialised device memory: float tensors hold NaN here, so a program that reads what nothing
        wrote shows it in its outputs."""
        self.calls["allocate_tensor_on_device"] += 1
        value = self._golden("allocate_tensor_on_device")(shape, dtype, layout, device, memory_config)
        fill = float("nan") if value.is_floating_point() else 0.0
        value = torch.full(tuple(value.shape), fill, dtype=torch.float32)
        out = GoldenTensor(
            self._ttnn, value, dtype, layout, memory_config or self._ttnn.DRAM_MEMORY_CONFIG, device
        )
        checks.placement(self._ttnn, out)
        return out

    def copy_host_to_device_tensor(self, host: GoldenTensor, dst: GoldenTensor, **_: Any) -> None:
        self.calls["copy_host_to_device_tensor"] += 1
        checks.same_spec("copy_host_to_device_tensor", host, dst)
        self._value(dst, "copy_host_to_device_tensor")
        dst.value.copy_(self._value(host, "copy_host_to_device_tensor", on_device=False))

    def copy_device_to_host_tensor(self, src: GoldenTensor, host: GoldenTensor, **_: Any) -> None:
        self.calls["copy_device_to_host_tensor"] += 1
        checks.same_spec("copy_device_to_host_tensor", src, host)
        host.value.copy_(self._value(src, "copy_device_to_host_tensor"))

    def deallocate(self, tensor: GoldenTensor, *_: Any, **__: Any) -> None:
        tensor.freed = True

    def synchronize_device(self, device: Any, *_: Any, **__: Any) -> None:
        """Ops run as they are called: nothing to wait for."""

    def zeros(
        self,
        shape: Any,
        dtype: Any = None,
        layout: Any = None,
        device: Any = None,
        memory_config: Any = None,
    ) -> GoldenTensor:
        ttnn = self._ttnn
        self.calls["zeros"] += 1
        value = self._golden("zeros")(tuple(shape), dtype)
        mem = (memory_config or ttnn.DRAM_MEMORY_CONFIG) if device is not None else None
        out = GoldenTensor(ttnn, value, dtype or ttnn.bfloat16, layout or ttnn.ROW_MAJOR_LAYOUT, mem, device)
        if device is not None:
            checks.placement(ttnn, out)
        return out

    def zeros_like(self, tensor: GoldenTensor, dtype: Any = None, **kw: Any) -> GoldenTensor:
        return self._out(self._run("zeros_like", tensor), tensor, dtype, mem=kw.get("memory_config"))

    def ones_like(self, tensor: GoldenTensor, dtype: Any = None, **kw: Any) -> GoldenTensor:
        return self._out(self._run("ones_like", tensor), tensor, dtype, mem=kw.get("memory_config"))

    def clone(
        self, tensor: GoldenTensor, memory_config: Any = None, dtype: Any = None, **_: Any
    ) -> GoldenTensor:
        return self._out(self._run("clone", tensor).clone(), tensor, dtype, mem=memory_config)

    def copy(self, src: GoldenTensor, dst: GoldenTensor) -> GoldenTensor:
        """src written into dst in place (cast to dst's dtype)."""
        checks.same_shape("copy", src, dst)
        value = self._run("copy", src, dst)
        dst.value.copy_(stored(self._ttnn, value, dst.dtype))
        return dst

    def dump_tensor(self, path: str, tensor: GoldenTensor, *_: Any, **__: Any) -> None:
        """The host tensor in ttnn's `.tensorbin` format (re-packed by ttnn: its values are already in the
        dtype's value set, so packing them again is exact)."""
        ttnn = self._ttnn
        real = ttnn.from_torch(self.to_torch(tensor), dtype=tensor.dtype, layout=tensor.layout)
        ttnn.dump_tensor(path, real)

    def load_tensor(self, path: str, *_: Any, **__: Any) -> GoldenTensor:
        self.calls["load_tensor"] += 1
        real = self._ttnn.load_tensor(path)
        value = self._golden("load_tensor")(path)
        return GoldenTensor(self._ttnn, value, real.dtype, real.layout)

    # ------------------------------------------------------------------ traces
    def _no_trace(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError(
            "golden mode: traces are not captured (a traced step runs as its untraced ops; "
            "alpamayo.tt.text.trace.TraceSwitch turns them off)"
        )

    begin_trace_capture = end_trace_capture = execute_trace = release_trace = _no_trace

    # ------------------------------------------------------------------ data movement
    def reshape(self, tensor: GoldenTensor, shape: Any, padded_shape: Any = None, **_: Any) -> GoldenTensor:
        """ttnn's reshape; with `padded_shape` (or a logical volume change inside the same padded volume,
        as ttnn allows) the new logical shape is a corner of the padded buffer: rows past the old logical
        shape read its padding (zero here)."""
        shape = tuple(int(d) for d in shape)
        value = self._value(tensor, "reshape")
        if -1 in shape:
            known = -int(torch.tensor(shape).prod())
            shape = tuple(value.numel() // known if d == -1 else d for d in shape)
        padded = tuple(int(d) for d in padded_shape) if padded_shape is not None else None
        if int(torch.tensor(shape).prod()) == value.numel():
            out = self._run("reshape", tensor, shape)
        else:
            old = tensor.padded
            target = padded or shape
            if int(torch.tensor(old).prod()) != int(torch.tensor(target).prod()):
                raise RuntimeError(
                    f"golden mode: reshape of {tensor} to {list(shape)} (padded {padded}) changes the volume"
                )
            full = torch.zeros(old, dtype=value.dtype)
            full[tuple(slice(0, d) for d in value.shape)] = value
            self.calls["reshape"] += 1
            out = full.reshape(target)[tuple(slice(0, d) for d in shape)].clone()
        return self._out(out, tensor, padded=padded if padded is not None and padded != shape else None)

    def slice(
        self, tensor: GoldenTensor, starts: Any, ends: Any, steps: Any = None, **kw: Any
    ) -> GoldenTensor:
        checks.slice_bounds(tensor, starts, ends)
        value = self._run("slice", tensor, list(starts), list(ends), steps)
        return self._out(value.clone(), tensor, mem=kw.get("memory_config"))

    def concat(
        self, tensors: list[GoldenTensor], dim: int = 0, memory_config: Any = None, **_: Any
    ) -> GoldenTensor:
        return self._out(self._run("concat", list(tensors), dim), tensors[0], mem=memory_config)

    def repeat(self, tensor: GoldenTensor, shape: Any, memory_config: Any = None, **_: Any) -> GoldenTensor:
        return self._out(self._run("repeat", tensor, list(shape)), tensor, mem=memory_config)

    def permute(self, tensor: GoldenTensor, dims: Any, memory_config: Any = None, **_: Any) -> GoldenTensor:
        return self._out(self._run("permute", tensor, tuple(dims)).contiguous(), tensor, mem=memory_config)

    def pad(self, tensor: GoldenTensor, padding: Any, value: float = 0.0, **kw: Any) -> GoldenTensor:
        pairs = [tuple(p) for p in padding]
        return self._out(self._run("pad", tensor, pairs, value), tensor, mem=kw.get("memory_config"))

    def typecast(self, tensor: GoldenTensor, dtype: Any, **kw: Any) -> GoldenTensor:
        value = self._run("typecast", tensor, dtype)
        return self._out(value, tensor, dtype, mem=kw.get("memory_config"))

    def to_layout(self, tensor: GoldenTensor, layout: Any, **kw: Any) -> GoldenTensor:
        if is_block_float(self._ttnn, tensor.dtype) and layout != self._ttnn.TILE_LAYOUT:
            raise RuntimeError(f"golden mode: a {tensor.dtype} tensor cannot leave TILE layout")
        value = self._run("to_layout", tensor, layout)
        return self._out(value.clone(), tensor, layout=layout, mem=kw.get("memory_config"))

    def to_memory_config(self, tensor: GoldenTensor, memory_config: Any, dtype: Any = None) -> GoldenTensor:
        """The tensor moved to `memory_config`; itself when it is already there (as ttnn returns it)."""
        if tensor.mem == memory_config and dtype in (None, tensor.dtype):
            self._value(tensor, "to_memory_config")
            return tensor
        value = self._run("to_memory_config", tensor, memory_config)
        return self._out(value.clone(), tensor, dtype, mem=memory_config)

    def interleaved_to_sharded(
        self, tensor: GoldenTensor, memory_config: Any, *_: Any, **__: Any
    ) -> GoldenTensor:
        if tensor.mem.is_sharded():
            raise RuntimeError(f"golden mode: interleaved_to_sharded of a sharded tensor {tensor}")
        value = self._run("interleaved_to_sharded", tensor)
        return self._out(value.clone(), tensor, mem=memory_config)

    def untilize_with_unpadding(
        self, tensor: GoldenTensor, output_tensor_end: Any, **kw: Any
    ) -> GoldenTensor:
        value = self._run("untilize_with_unpadding", tensor, list(output_tensor_end))
        return self._out(
            value.clone(), tensor, layout=self._ttnn.ROW_MAJOR_LAYOUT, mem=kw.get("memory_config")
        )

    def fill_cache(
        self, cache: GoldenTensor, tensor: GoldenTensor, batch_idx: int, update_idx: int = 0
    ) -> GoldenTensor:
        """ttnn's golden, in place: cache[batch_idx, :, update_idx : update_idx + S] = tensor. fill_cache copies
        raw tiles, so the dtypes must match (ttnn refuses otherwise); `update_idx` is tile-aligned."""
        if cache.dtype != tensor.dtype:
            raise RuntimeError(
                f"golden mode: fill_cache of a {tensor.dtype} tensor into a {cache.dtype} cache"
            )
        if update_idx % TILE:
            raise RuntimeError(f"golden mode: fill_cache update_idx {update_idx} is not a multiple of {TILE}")
        checks.fits(
            "fill_cache", cache, batch_idx, update_idx + tensor.value.shape[-2], tensor.value.shape[1]
        )
        self._run("fill_cache", cache, tensor, batch_idx, update_idx=update_idx)  # writes cache.value
        return cache

    def embedding(
        self,
        indices: GoldenTensor,
        weight: GoldenTensor,
        layout: Any = None,
        memory_config: Any = None,
        dtype: Any = None,
        **_: Any,
    ) -> GoldenTensor:
        if weight.layout != self._ttnn.ROW_MAJOR_LAYOUT:
            raise RuntimeError(f"golden mode: embedding reads a ROW_MAJOR table, got {weight}")
        index = self._value(indices, "embedding")
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= weight.value.shape[-2]):
            raise RuntimeError(
                f"golden mode: embedding index outside the table's {weight.value.shape[-2]} rows"
            )
        value = self._run("embedding", indices, weight)
        return self._out(
            value, weight, dtype, layout or self._ttnn.ROW_MAJOR_LAYOUT, memory_config or indices.mem
        )

    def scatter(
        self, tensor: GoldenTensor, dim: int, index: GoldenTensor, src: GoldenTensor, **kw: Any
    ) -> GoldenTensor:
        value = self._run("scatter", tensor, dim, index, src)
        return self._out(value, tensor, mem=kw.get("memory_config"))

    # ------------------------------------------------------------------ element-wise
    def _binary(
        self,
        name: str,
        a: Any,
        b: Any,
        memory_config: Any = None,
        dtype: Any = None,
        output_tensor: GoldenTensor | None = None,
        **kw: Any,
    ) -> GoldenTensor:
        like = a if isinstance(a, GoldenTensor) else b
        if isinstance(a, GoldenTensor) and isinstance(b, GoldenTensor):
            checks.broadcastable(name, a, b)
        value = self._run(name, a, b, **kw)
        if output_tensor is not None:  # in place (ttnn's optional output)
            checks.same_shape(name, output_tensor, like)
            output_tensor.value.copy_(stored(self._ttnn, value, output_tensor.dtype))
            return output_tensor
        return self._out(value, like, dtype, mem=memory_config)

    add = partialmethod(_binary, "add")
    mul = partialmethod(_binary, "mul")
    multiply = partialmethod(_binary, "multiply")
    div = partialmethod(_binary, "div")
    eq = partialmethod(_binary, "eq")

    def where(self, predicate: GoldenTensor, true_value: Any, false_value: Any, **kw: Any) -> GoldenTensor:
        value = self._run("where", predicate, true_value, false_value)
        like = next((x for x in (true_value, false_value) if isinstance(x, GoldenTensor)), predicate)
        return self._out(value, predicate, like.dtype, mem=kw.get("memory_config"))

    def _unary(self, name: str, tensor: GoldenTensor, memory_config: Any = None, **kw: Any) -> GoldenTensor:
        return self._out(self._run(name, tensor, **kw), tensor, mem=memory_config)

    sin = partialmethod(_unary, "sin")
    frac = partialmethod(_unary, "frac")
    gelu = partialmethod(_unary, "gelu")

    # ------------------------------------------------------------------ reductions, normalisation
    def sum(
        self,
        tensor: GoldenTensor,
        dim: Any = None,
        keepdim: bool = False,
        memory_config: Any = None,
        **_: Any,
    ) -> GoldenTensor:
        return self._out(self._run("sum", tensor, dim, keepdim), tensor, mem=memory_config)

    def softmax(
        self, tensor: GoldenTensor, dim: int = -1, memory_config: Any = None, **_: Any
    ) -> GoldenTensor:
        return self._out(self._run("softmax", tensor, dim), tensor, mem=memory_config)

    def topk(
        self, tensor: GoldenTensor, k: int = 32, dim: int = -1, **kw: Any
    ) -> tuple[GoldenTensor, GoldenTensor]:
        values, indices = self._run("topk", tensor, k, dim)
        mem = kw.get("memory_config")
        return self._out(values, tensor, mem=mem), self._out(indices, tensor, self._ttnn.uint32, mem=mem)

    def _norm(
        self,
        name: str,
        tensor: GoldenTensor,
        memory_config: Any = None,
        program_config: Any = None,
        **kw: Any,
    ) -> GoldenTensor:
        ck = kw.get("compute_kernel_config")
        checks.norm_program(self._ttnn, name, tensor, program_config, memory_config, ck)
        value = self._run(name, tensor, **kw)
        return self._out(value, tensor, mem=memory_config)

    rms_norm = partialmethod(_norm, "rms_norm")
    layer_norm = partialmethod(_norm, "layer_norm")

    # ------------------------------------------------------------------ matmuls
    def _matmul(
        self,
        name: str,
        a: GoldenTensor,
        b: GoldenTensor,
        memory_config: Any = None,
        dtype: Any = None,
        program_config: Any = None,
        **kw: Any,
    ) -> GoldenTensor:
        checks.matmul_program(self._ttnn, name, a, b, program_config, kw.pop("compute_kernel_config", None))
        value = self._run(name, a, b, program_config=program_config, **kw)
        mem = checks.matmul_output_memory(self._ttnn, a, value, memory_config, program_config)
        return self._out(value, a, dtype, mem=mem)

    linear = partialmethod(_matmul, "linear")
    matmul = partialmethod(_matmul, "matmul")

    def sparse_matmul(
        self,
        a: GoldenTensor,
        b: GoldenTensor,
        *,
        sparsity: GoldenTensor,
        nnz: int | None = None,
        memory_config: Any = None,
        dtype: Any = None,
        optional_output_tensor: GoldenTensor | None = None,
        program_config: Any = None,
        **kw: Any,
    ) -> GoldenTensor:
        """ttnn's golden; the count of nonzero sparsity entries must be `nnz` (the device op hangs on a
        wrong count, `alpamayo.tt.moe`)."""
        mask = self._value(sparsity, "sparse_matmul")
        if nnz is not None and int((mask != 0).sum()) != nnz:
            raise RuntimeError(
                f"golden mode: sparse_matmul nnz={nnz} but the sparsity holds {int((mask != 0).sum())} "
                "nonzeros (the device op deadlocks on a wrong count)"
            )
        kw.pop("compute_kernel_config", None)
        value = self._run(
            "sparse_matmul",
            a,
            b,
            sparsity=sparsity,
            nnz=nnz,
            optional_output_tensor=optional_output_tensor,
            program_config=program_config,
            **kw,
        )
        if optional_output_tensor is not None:
            checks.same_shape_as("sparse_matmul", optional_output_tensor, tuple(value.shape))
            optional_output_tensor.value.copy_(stored(self._ttnn, value, optional_output_tensor.dtype))
            return optional_output_tensor
        padded = tile_padded(self._ttnn, tuple(value.shape), self._ttnn.TILE_LAYOUT)
        return self._out(value, a, dtype, mem=memory_config, padded=padded)

    # ------------------------------------------------------------------ attention
    def _sdpa(
        self,
        q: GoldenTensor,
        k: GoldenTensor,
        v: GoldenTensor,
        *,
        program_config: Any = None,
        memory_config: Any = None,
        **kw: Any,
    ) -> GoldenTensor:
        checks.sdpa_program("scaled_dot_product_attention", q, k, program_config)
        kw.pop("compute_kernel_config", None)
        value = self._run("transformer.scaled_dot_product_attention", q, k, v, **kw)
        return self._out(value, q, mem=memory_config)

    def _sdpa_decode(
        self, q: GoldenTensor, k: GoldenTensor, v: GoldenTensor, *, memory_config: Any = None, **kw: Any
    ) -> GoldenTensor:
        kw.pop("compute_kernel_config", None)
        kw.pop("program_config", None)
        checks.cur_pos("scaled_dot_product_attention_decode", kw.get("cur_pos_tensor"), k)
        value = self._run("transformer.scaled_dot_product_attention_decode", q, k, v, **kw)
        return self._out(value, q, mem=memory_config)

    def _paged_sdpa_decode(
        self,
        q: GoldenTensor,
        k: GoldenTensor,
        v: GoldenTensor,
        page_table: GoldenTensor,
        *,
        memory_config: Any = None,
        spec_multi_pos_tiles: int | None = None,
        **kw: Any,
    ) -> GoldenTensor:
        kw.pop("compute_kernel_config", None)
        kw.pop("program_config", None)
        if spec_multi_pos_tiles:
            self._own(OWN_OPS[-1])
            value = ops.paged_sdpa_decode_multi_pos(
                self._value(q, "paged_sdpa_decode"),
                self._value(k, "paged_sdpa_decode"),
                self._value(v, "paged_sdpa_decode"),
                self._value(page_table, "paged_sdpa_decode"),
                self._value(kw["cur_pos_tensor"], "paged_sdpa_decode"),
                spec_multi_pos_tiles,
                kw.get("scale"),
            )
        else:
            value = self._run(
                "transformer.paged_scaled_dot_product_attention_decode", q, k, v, page_table, **kw
            )
        return self._out(value, q, mem=memory_config)

    # ------------------------------------------------------------------ ours (alpamayo.tt.golden.ops)
    def _minimal_matmul(
        self,
        a: GoldenTensor,
        w: GoldenTensor,
        bias_tensor: GoldenTensor | None = None,
        *,
        config: Any = None,
        memory_config: Any = None,
        dtype: Any = None,
        fused_activation: Any = None,
        compute_kernel_config: Any = None,
        **_: Any,
    ) -> GoldenTensor:
        self._own("experimental.minimal_matmul")
        checks.minimal_matmul(self._ttnn, a, w, bias_tensor, config, compute_kernel_config)
        value = ops.minimal_matmul(
            self._value(a, "minimal_matmul"),
            self._value(w, "minimal_matmul"),
            None if bias_tensor is None else self._value(bias_tensor, "minimal_matmul"),
            fused_activation,
        )
        return self._out(value, a, dtype, mem=memory_config)

    def _nlp_create_qkv_heads(
        self,
        x: GoldenTensor,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        transpose_k_heads: bool = True,
        memory_config: Any = None,
        **_: Any,
    ) -> tuple[GoldenTensor, ...]:
        self._own("experimental.nlp_create_qkv_heads")
        q, k, v = ops.nlp_create_qkv_heads(
            self._value(x, "nlp_create_qkv_heads"), num_heads, num_kv_heads or num_heads, transpose_k_heads
        )
        return tuple(self._out(t, x, mem=memory_config) for t in (q, k, v))

    def _nlp_create_qkv_heads_decode(
        self,
        x: GoldenTensor,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        memory_config: Any = None,
        **_: Any,
    ) -> tuple[GoldenTensor, ...]:
        self._own("experimental.nlp_create_qkv_heads_decode")
        q, k, v = ops.nlp_create_qkv_heads_decode(
            self._value(x, "nlp_create_qkv_heads_decode"), num_heads, num_kv_heads or num_heads
        )
        return tuple(
            self._out(
                t, x, mem=checks.heads_decode_memory(self._ttnn, t.shape[1], t.shape[-1], memory_config)
            )
            for t in (q, k, v)
        )

    def _nlp_concat_heads(self, x: GoldenTensor, *, memory_config: Any = None, **_: Any) -> GoldenTensor:
        self._own("experimental.nlp_concat_heads")
        return self._out(ops.nlp_concat_heads(self._value(x, "nlp_concat_heads")), x, mem=memory_config)

    def _nlp_concat_heads_decode(
        self, x: GoldenTensor, *, num_heads: int, memory_config: Any = None, **_: Any
    ) -> GoldenTensor:
        self._own("experimental.nlp_concat_heads_decode")
        if not x.mem.is_sharded():
            raise RuntimeError(f"golden mode: nlp_concat_heads_decode reads height-sharded heads, got {x}")
        value = ops.nlp_concat_heads_decode(self._value(x, "nlp_concat_heads_decode"), num_heads)
        mem = memory_config or checks.concat_heads_decode_memory(self._ttnn, num_heads, x.value.shape[-1])
        return self._out(value, x, mem=mem)

    def _rotary_embedding_hf(
        self,
        x: GoldenTensor,
        cos: GoldenTensor,
        sin: GoldenTensor,
        *,
        is_decode_mode: bool = False,
        memory_config: Any = None,
        **_: Any,
    ) -> GoldenTensor:
        self._own("experimental.rotary_embedding_hf")
        checks.rotary(x, cos, sin, is_decode_mode)
        value = ops.rotary_embedding_hf(
            self._value(x, "rotary_embedding_hf"),
            self._value(cos, "rotary_embedding_hf"),
            self._value(sin, "rotary_embedding_hf"),
            is_decode_mode,
        )
        return self._out(value, x, mem=memory_config)

    def _paged_update_cache(
        self,
        cache: GoldenTensor,
        x: GoldenTensor,
        *,
        update_idxs_tensor: GoldenTensor,
        page_table: GoldenTensor | None = None,
        **_: Any,
    ) -> GoldenTensor:
        """In place (bf16 / float32 rows repacked into the cache's dtype)."""
        self._own("experimental.paged_update_cache")
        if is_block_float(self._ttnn, x.dtype):
            raise RuntimeError(
                f"golden mode: paged_update_cache takes FLOAT32 or BFLOAT16 rows (it repacks them), got {x.dtype}"
            )
        self._value(cache, "paged_update_cache")
        ops.paged_update_cache(
            cache.value,
            self._value(x, "paged_update_cache"),
            self._value(update_idxs_tensor, "paged_update_cache"),
            None if page_table is None else self._value(page_table, "paged_update_cache"),
            lambda rows: stored(self._ttnn, rows, cache.dtype),
        )
        return cache

    def _fast_reduce_nc(
        self, x: GoldenTensor, *, dims: Iterable[int], memory_config: Any = None, **_: Any
    ) -> GoldenTensor:
        self._own("experimental.fast_reduce_nc")
        value = ops.fast_reduce_nc(self._value(x, "fast_reduce_nc"), tuple(dims))
        return self._out(value, x, mem=memory_config)
