"""AlpaSim policy bridge: AlpaSim's egodriver protos (``v0``), a typed client and the driver service."""
