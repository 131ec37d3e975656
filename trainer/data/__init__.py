"""RL prompt data: parquet dataset, DataProto collation, resumable batching."""

from .collate import collate_to_dataproto
from .dataloader import ResumableBatchSampler, RLDataLoader, make_dataloader
from .rl_dataset import TRUNCATION_MODES, RLDataset

__all__ = [
    "TRUNCATION_MODES",
    "RLDataLoader",
    "RLDataset",
    "ResumableBatchSampler",
    "collate_to_dataproto",
    "make_dataloader",
]
