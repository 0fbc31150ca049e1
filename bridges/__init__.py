"""Bridges between the model and the outside world, one subpackage per layer of docs/architecture.md (this
`__init__` imports none of them):

* `bridges.wire` (layer 1): the node's ZeroMQ wire protocol (`protocol`), JPEG checks and decoding (`jpeg`),
  socket options and CURVE keys (`sockets`), and the clients drivers and consumers use (`client`);
* `bridges.drives` (layer 1): recorded drives behind one interface (`open_drive`: Foxglove MCAP, rosbag2 MCAP,
  PhysicalAI-AV clips), what the readers share (`recording`), MCAP and ROS 2 messages (`mcap_messages`,
  `ros2_messages`), MCAP writing (`mcap_writer`) and `drive-info`'s description;
* `bridges.node` (layer 7): the on-vehicle inference node (`server.InferenceNode`), its configuration
  (`config`), input window (`window`) and disconnect causes (`disconnects`);
* `bridges.camera_sim` (layer 7): synthetic multi-camera frames and ego poses published to a node;
* `bridges.alpasim` (layer 7): the AlpaSim egodriver service.
"""
