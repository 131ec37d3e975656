"""RL prompt data: parquet dataset, DataProto collation, resumable batching."""

from trainer.data_names import TRUNCATION_MODES

from .collate import collate_to_dataproto
from .dataloader import ResumableBatchSampler, RLDataLoader, make_dataloader
from .rl_dataset import RLDataset

__all__ = [
    "TRUNCATION_MODES",
    "RLDataLoader",
    "RLDataset",
    "ResumableBatchSampler",
    "collate_to_dataproto",
    "make_dataloader",
]
