"""The on-vehicle inference node: camera frames and ego poses in over ZeroMQ, trajectories out.

* `bridges.node.server`: `InferenceNode`, the node itself (start/stop in-process, endpoints, counters);
* `bridges.node.config`: the node's validated configuration (YAML plus overrides);
* `bridges.node.window`: per-camera frame rings, the ego track and the 10 Hz input window;
* `bridges.node.disconnects`: why peers disconnected, from the sockets' monitor events.

An application (layer 7, docs/architecture.md): it speaks `bridges.wire` and runs an `alpamayo` predictor.
"""
