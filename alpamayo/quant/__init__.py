"""Weight-only int8 / int4 quantisation of the torch backend's linears (see docs/quantisation.md).

`QuantRecipe` says what to quantise; `quantise_weight` turns one [out, in] weight into the packed form that
PyTorch's own weight-only kernels read (at int8 where int4 cannot pack a layer's width: `layer_mode`);
`alpamayo.text.linear.pack_linears` applies it at load and reports those layers (`describe_fallbacks`).
"""

from alpamayo.quant.kernels import check_kernel, describe_fallbacks, layer_mode
from alpamayo.quant.recipe import DEFAULT_GROUP_SIZE, GROUP_SIZES, PART_NAMES, QUANT_MODES, QuantRecipe
from alpamayo.quant.weights import Int4Weight, Int8Weight, QuantWeight, int4_codes, quantise_weight

__all__ = [
    "DEFAULT_GROUP_SIZE",
    "GROUP_SIZES",
    "PART_NAMES",
    "QUANT_MODES",
    "Int4Weight",
    "Int8Weight",
    "QuantRecipe",
    "QuantWeight",
    "check_kernel",
    "describe_fallbacks",
    "int4_codes",
    "layer_mode",
    "quantise_weight",
]
