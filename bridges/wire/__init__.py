"""The node's ZeroMQ wire and what speaks it, for the node, its drivers and its consumers alike.

* `bridges.wire.protocol`: the message schema (camera frames, ego poses in; trajectories out), encode/decode;
* `bridges.wire.jpeg`: JPEG checks at intake (no pixel decoded), the decode, and the bounded decoding pool;
* `bridges.wire.sockets`: ZeroMQ socket options, bind/connect and CURVE keys shared by the node and the
  clients;
* `bridges.wire.client`: `FramePublisher`, `TrajectorySubscriber`, `ControlClient` for drivers and consumers.

Layer 1 (docs/architecture.md): no model code, so a recorder or a client runs without torch models.
"""
