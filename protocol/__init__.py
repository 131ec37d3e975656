"""`DataProto`: the batch container passed between the driver and worker groups."""

from protocol.auto_padding import DataProtoConfig
from protocol.batch_folding import fold_batch_dim, unfold_batch_dim
from protocol.data_proto import DataProto, DataProtoItem
from protocol.dict_union import union_numpy_dict, union_tensor_dict
from protocol.errors import ProtocolTypeError, ProtocolValueError
from protocol.future import DataProtoFuture
from protocol.padding import pad_dataproto_to_divisor, unpad_dataproto

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "ProtocolTypeError",
    "ProtocolValueError",
    "fold_batch_dim",
    "pad_dataproto_to_divisor",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
