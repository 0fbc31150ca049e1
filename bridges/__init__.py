"""Bridges between the model and the outside world.

* `bridges.mcap_messages`: Foxglove and project message schemas, protobuf and JSON codecs;
* `bridges.mcap_writer`: `RecordingWriter`, append-only MCAP writing of message dicts;
* `bridges.recording`: recorded drives (`Drive`, `RecordingLayout`, camera frames, the ego pose track).
"""
