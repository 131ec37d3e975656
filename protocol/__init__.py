"""`DataProto`: the batch container passed between the driver and worker groups."""

from protocol.data_proto import DataProto, DataProtoItem
from protocol.future import DataProtoFuture
from protocol.padding import pad_dataproto_to_divisor, unpad_dataproto

__all__ = ["DataProto", "DataProtoFuture", "DataProtoItem", "pad_dataproto_to_divisor", "unpad_dataproto"]
