"""Append-only MCAP writer of message dicts (`bridges.drives.mcap_messages` layout), one channel per topic.

Used for synthetic drives and for replay outputs. MCAP writes are append-only, so a crash loses only the
unfinished chunk; `close()` writes the summary Foxglove uses to seek.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from mcap.records import Channel, Message, Schema
from mcap.writer import CompressionType, Writer

from bridges.drives.mcap_messages import encode, register_schema, wire_encoding

COMPRESSION = {"zstd": CompressionType.ZSTD, "lz4": CompressionType.LZ4, "none": CompressionType.NONE}


class RecordingWriter:
    """`write(topic, schema, message, t_ns)`; each topic keeps the schema and encoding of its first message.

    The message's log and publish times are `t_ns` (recording clock), never the wall clock, so two runs that
    produce the same messages write the same bytes.
    """

    def __init__(self, path: str | Path, compression: str = "zstd", chunk_size: int = 1 << 20):
        if compression not in COMPRESSION:
            raise ValueError(f"compression {compression!r} unknown; allowed: {sorted(COMPRESSION)}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._writer = Writer(self._file, chunk_size=chunk_size, compression=COMPRESSION[compression])
        self._writer.start(profile="", library="alpamayo-tt")
        self._schemas: dict[tuple[str, str], int] = {}
        self._channels: dict[str, tuple[int, str, str]] = {}
        self._sequence: Counter[str] = Counter()  # messages written per topic
        self._copied_schemas: dict[tuple[str, str, bytes], int] = {}

    def write(
        self, topic: str, schema_name: str, message: dict[str, Any], t_ns: int, encoding: str = "protobuf"
    ) -> None:
        """Append one message; protobuf falls back to JSON for schemas that only have a JSON form."""
        encoding = wire_encoding(schema_name, encoding)
        self.write_encoded(topic, schema_name, encoding, encode(schema_name, message, encoding), t_ns)

    def write_encoded(self, topic: str, schema_name: str, encoding: str, payload: bytes, t_ns: int) -> None:
        """Append a message already serialised as `encoding` (see `bridges.drives.mcap_messages.encode`)."""
        if topic not in self._channels:
            key = (schema_name, encoding)
            if key not in self._schemas:
                self._schemas[key] = register_schema(self._writer, schema_name, encoding)
            channel = self._writer.register_channel(topic, encoding, self._schemas[key])
            self._channels[topic] = (channel, schema_name, encoding)
        self._append(topic, schema_name, encoding, payload, t_ns, t_ns)

    def copy(self, schema: Schema, channel: Channel, message: Message) -> None:
        """Append a message read from another MCAP file unchanged: its schema record, encoding and times."""
        topic, encoding = channel.topic, channel.message_encoding
        if topic not in self._channels:
            key = (schema.name, schema.encoding, schema.data)
            if key not in self._copied_schemas:
                self._copied_schemas[key] = self._writer.register_schema(
                    schema.name, schema.encoding, schema.data
                )
            channel_id = self._writer.register_channel(
                topic, encoding, self._copied_schemas[key], dict(channel.metadata)
            )
            self._channels[topic] = (channel_id, schema.name, encoding)
        self._append(topic, schema.name, encoding, message.data, message.log_time, message.publish_time)

    def _append(
        self, topic: str, schema_name: str, encoding: str, data: bytes, log_time: int, publish_time: int
    ) -> None:
        """Add a message to `topic`'s channel, which must carry `schema_name` in `encoding`; sequence numbers
        count per topic from 1."""
        channel, topic_schema, topic_encoding = self._channels[topic]
        if (topic_schema, topic_encoding) != (schema_name, encoding):
            raise ValueError(
                f"topic {topic} carries {topic_schema} ({topic_encoding}); cannot write {schema_name} "
                f"({encoding}) on it"
            )
        self._sequence[topic] += 1
        self._writer.add_message(channel, log_time, data, publish_time, self._sequence[topic])

    def metadata(self, name: str, data: dict[str, str]) -> None:
        self._writer.add_metadata(name, data)

    def close(self) -> None:
        if not self._file.closed:
            self._writer.finish()
            self._file.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
