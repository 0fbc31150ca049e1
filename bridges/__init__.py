"""ZeroMQ bridge: the on-vehicle inference node, its wire protocol, and the client helpers.

* `bridges.protocol`: the message schema (camera frames, ego poses in; trajectories out), encode/decode;
* `bridges.config`: the node's validated configuration (YAML plus overrides);
* `bridges.window`: per-camera frame rings, the ego track and the 10 Hz input window;
* `bridges.node`: `InferenceNode`, the node itself (start/stop in-process, endpoints, counters);
* `bridges.client`: `FramePublisher`, `TrajectorySubscriber`, `ControlClient` for drivers and consumers;
* `bridges.camera_sim`: synthetic multi-camera frames and ego poses.
"""
