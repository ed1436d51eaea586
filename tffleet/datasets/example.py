"""`tf.train.Example` without TensorFlow: its messages (tensorflow/core/example/example.proto and
feature.proto) built at runtime from descriptors, in a pool of their own, with the `protobuf`
package alone, so the API (which has no TensorFlow) can read TFRecord files of Examples.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _field(message: Any, name: str, number: int, kind: int, **more: Any) -> None:
    field = message.field.add(name=name, number=number, type=kind, **more)
    field.label = more.get("label", _F.LABEL_OPTIONAL)


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="tffleet/example.proto", package="tensorflow", syntax="proto3"
    )
    for name, kind in (
        ("BytesList", _F.TYPE_BYTES),
        ("FloatList", _F.TYPE_FLOAT),
        ("Int64List", _F.TYPE_INT64),
    ):
        message = proto.message_type.add(name=name)
        _field(message, "value", 1, kind, label=_F.LABEL_REPEATED)
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
        (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")),
        start=1,
    ):
        _field(feature, name, number, _F.TYPE_MESSAGE, type_name=f".tensorflow.{type_name}",
               oneof_index=0)  # fmt: skip
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=".tensorflow.Feature")
    _field(features, "feature", 1, _F.TYPE_MESSAGE, label=_F.LABEL_REPEATED,
           type_name=".tensorflow.Features.FeatureEntry")  # fmt: skip
    example = proto.message_type.add(name="Example")
    _field(example, "features", 1, _F.TYPE_MESSAGE, type_name=".tensorflow.Features")
    return proto


@lru_cache(maxsize=1)
def example_class() -> Any:
    """The Example message class (built once per process)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


# A feature's kind as the dtype of its values.
KIND_DTYPES = {"bytes_list": "string", "float_list": "float32", "int64_list": "int64"}


def decode(record: bytes) -> dict[str, np.ndarray]:
    """An Example's features as flat arrays (bytes values as an object array of bytes); a
    ValueError when the record is no Example."""
    example = example_class()()
    try:
        example.ParseFromString(record)
    except Exception as exc:  # protobuf's DecodeError, whichever implementation
        raise ValueError(f"not a tf.train.Example ({type(exc).__name__})") from None
    out: dict[str, np.ndarray] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None:
            out[name] = np.empty(0, dtype=np.float32)
        elif kind == "bytes_list":
            values = np.empty(len(feature.bytes_list.value), dtype=object)
            values[:] = list(feature.bytes_list.value)
            out[name] = values
        else:
            out[name] = np.asarray(getattr(feature, kind).value, dtype=KIND_DTYPES[kind])
    return out


def kind_of(array: np.ndarray) -> str:
    return "string" if array.dtype == object else array.dtype.name


def encode(features: dict[str, np.ndarray | list[Any]]) -> bytes:
    """An Example of these flat features (float32, int64 or bytes values): for tests, and for
    anyone writing TFRecord files without TensorFlow."""
    example = example_class()()
    for name, values in features.items():
        array = np.asarray(values)
        feature = example.features.feature[name]
        if array.dtype.kind in "SUO":
            feature.bytes_list.value.extend(
                v if isinstance(v, bytes) else str(v).encode() for v in array.ravel()
            )
        elif array.dtype.kind == "f":
            feature.float_list.value.extend(array.ravel().astype(np.float32).tolist())
        else:
            feature.int64_list.value.extend(array.ravel().astype(np.int64).tolist())
    return bytes(example.SerializeToString())
