"""Bridges between the model and the outside world: the on-vehicle ZeroMQ node, its wire protocol and client
helpers, and recorded drives (MCAP).

* `bridges.wire.protocol`: the message schema (camera frames, ego poses in; trajectories out), encode/decode;
* `bridges.wire.jpeg`: JPEG checks at intake (no pixel decoded), the decode, and the bounded decoding pool;
* `bridges.node.config`: the node's validated configuration (YAML plus overrides);
* `bridges.node.window`: per-camera frame rings, the ego track and the 10 Hz input window;
* `bridges.node.server`: `InferenceNode`, the node itself (start/stop in-process, endpoints, counters);
* `bridges.wire.client`: `FramePublisher`, `TrajectorySubscriber`, `ControlClient` for drivers and consumers;
* `bridges.wire.sockets`: ZeroMQ socket options, bind/connect and CURVE keys shared by the node and the clients;
* `bridges.camera_sim`: synthetic multi-camera frames and ego poses;
* `bridges.drives.mcap_messages`: Foxglove and project message schemas for recordings, protobuf and JSON codecs;
* `bridges.drives.mcap_writer`: `RecordingWriter`, append-only MCAP writing of message dicts;
* `bridges.drives.recording`: what the drive readers share (`RecordingLayout`, recorded camera frames, the ego pose track,
  the errors);
* `bridges.drives`: every kind of recorded drive behind one interface (`open_drive`: Foxglove MCAP in
  `bridges.drives.mcap`, rosbag2 MCAP, PhysicalAI-AV clips), and `drive-info`'s description;
* `bridges.drives.ros2_messages`: the ROS 2 message definitions bags are read and written with.
"""
