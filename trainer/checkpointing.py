"""The driver's checkpoints: every role's shards plus the driver's state (`driver_state.json`: step, dataloader
position, rollout state) in one `global_step_N/` folder under `trainer.default_local_dir`.

The folder format (atomic save, manifest, resume lookup) is workers/checkpoint_format.py, shared with the
strategy API's checkpoints; its names are importable from here too (`trainer.checkpointing.checkpoint_problem`).
"""

from __future__ import annotations

from workers.checkpoint_format import (
    DRIVER_STATE_FILE,
    LATEST_FILE,
    MANIFEST_FILE,
    STEP_PREFIX,
    CheckpointError,
    checkpoint_problem,
    find_resume_dir,
    load_driver_state,
    save_checkpoint,
    step_dir,
    write_manifest,
)

__all__ = [
    "DRIVER_STATE_FILE",
    "LATEST_FILE",
    "MANIFEST_FILE",
    "STEP_PREFIX",
    "CheckpointError",
    "checkpoint_problem",
    "find_resume_dir",
    "load_driver_state",
    "save_checkpoint",
    "step_dir",
    "write_manifest",
]
