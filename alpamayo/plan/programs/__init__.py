"""Program configs of the ttnn backend, one module per component (pure Python: no ttnn, no device).

`text` (the backbone's decode and prefill), `moe` (the sparse layers' MoE block), `vision` (the vision tower)
and `expert` (the action expert's Euler step) each pick the grids and block sizes their device code uses, and
refuse an impossible model/recipe/device combination before any device call; `grid` holds what they share.
"""
