"""What one Blackhole p150 is expected to do: published single-p150 measurements (`anchors`, the rows of
`p150_anchors.json`), the workloads they measured expressed with the roofline's own stage builders
(`workloads`), and the efficiency model fitted to them (`model`) that `alpamayo plan` prints beside the
roofline. Pure Python (no ttnn, no device); `alpamayo.tt.card_check` measures new anchors on a card.
"""
