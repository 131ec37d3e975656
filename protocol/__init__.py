"""`DataProto`: the batch container passed between the driver and worker groups."""

from protocol.auto_padding import DataProtoConfig
from protocol.batch_folding import fold_batch_dim, unfold_batch_dim
from protocol.data_proto import DataProto, DataProtoItem
from protocol.dict_union import union_numpy_dict, union_tensor_dict
from protocol.errors import ProtocolTypeError, ProtocolValueError
from protocol.future import DataProtoFuture
from protocol.padding import pad_dataproto_to_divisor, unpad_dataproto
from protocol.tensor_serialization import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "ProtocolTypeError",
    "ProtocolValueError",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
