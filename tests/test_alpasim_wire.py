"""The shipped protos are AlpaSim's wire contract: names, numbers and types equal the facts of AlpaSim's .proto
text (tests/alpasim_wire_facts.json, compiled from NVlabs/alpasim's common/sensorsim/egodriver.proto)."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.internal import decoder

from bridges.alpasim.v0 import ALPASIM_GRPC_VERSION, common_pb2, egodriver_pb2, sensorsim_pb2

FACTS = json.loads((Path(__file__).parent / "alpasim_wire_facts.json").read_text())
_TYPES = {v: k for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()}
_LABELS = {v: k for k, v in descriptor_pb2.FieldDescriptorProto.Label.items()}


def _ours() -> tuple[dict, dict, dict]:
    msgs, enums, services = {}, {}, {}

    def walk(prefix: str, m: descriptor_pb2.DescriptorProto) -> None:
        msgs[prefix + m.name] = [
            {
                "name": f.name,
                "number": f.number,
                "type": _TYPES[f.type],
                "label": _LABELS[f.label],
                "type_name": f.type_name,
                "oneof": m.oneof_decl[f.oneof_index].name
                if f.HasField("oneof_index") and not f.proto3_optional
                else None,
            }
            for f in m.field
        ]
        for n in m.nested_type:
            walk(prefix + m.name + ".", n)
        for e in m.enum_type:
            enums[prefix + m.name + "." + e.name] = {v.name: v.number for v in e.value}

    for module in (common_pb2, sensorsim_pb2, egodriver_pb2):
        fp = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fp)
        for m in fp.message_type:
            walk(fp.package + ".", m)
        for e in fp.enum_type:
            enums[fp.package + "." + e.name] = {v.name: v.number for v in e.value}
        for s in fp.service:
            services[fp.package + "." + s.name] = [
                {"name": x.name, "input": x.input_type, "output": x.output_type} for x in s.method
            ]
    return msgs, enums, services


def test_the_api_version_is_the_release_of_the_shipped_protos():
    """get_version reports ALPASIM_GRPC_VERSION (tests/test_alpasim_service.py checks the answer over gRPC): the
    alpasim_grpc version of the commit the protos and the facts were taken from."""
    assert ".".join(map(str, ALPASIM_GRPC_VERSION)) == FACTS["alpasim_grpc_version"]


def test_descriptors_equal_alpasim_facts():
    msgs, enums, services = _ours()
    assert msgs == FACTS["messages"]
    assert enums == FACTS["enums"]
    assert services == FACTS["services"]


def _tags(data: bytes) -> list[tuple[int, int]]:
    """(field number, wire type) of each top-level field in ``data``."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = decoder._DecodeVarint(data, pos)
        number, wire = key >> 3, key & 7
        out.append((number, wire))
        if wire == 0:
            _, pos = decoder._DecodeVarint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            n, pos = decoder._DecodeVarint(data, pos)
            pos += n
        elif wire == 5:
            pos += 4
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    return out


def test_serialised_drive_messages_use_alpasim_field_numbers():
    # fixed64 -> wire type 1, length-delimited -> 2: the numbers AlpaSim's parser reads.
    req = egodriver_pb2.DriveRequest(session_uuid="s", time_now_us=5, time_query_us=7, renderer_data=b"x")
    assert _tags(req.SerializeToString()) == [(1, 2), (3, 1), (4, 1), (5, 2)]
    pose = common_pb2.PoseAtTime(
        pose=common_pb2.Pose(vec=common_pb2.Vec3(x=1.0), quat=common_pb2.Quat(w=1.0)), timestamp_us=9
    )
    resp = egodriver_pb2.DriveResponse(
        trajectory=common_pb2.Trajectory(poses=[pose]),
        debug_info=egodriver_pb2.DriveResponse.DebugInfo(unstructured_debug_info=b"r"),
        terminate_session=True,
    )
    data = resp.SerializeToString()
    assert _tags(data) == [(2, 2), (3, 2), (4, 0)]
    assert egodriver_pb2.DriveResponse.FromString(data) == resp
    img = egodriver_pb2.RolloutCameraImage(
        session_uuid="s",
        camera_image=egodriver_pb2.RolloutCameraImage.CameraImage(
            frame_start_us=1, frame_end_us=2, image_bytes=b"j", logical_id="c"
        ),
    )
    assert _tags(img.SerializeToString()) == [(1, 2), (3, 2)]
    assert _tags(img.camera_image.SerializeToString()) == [(2, 1), (3, 1), (4, 2), (5, 2)]
