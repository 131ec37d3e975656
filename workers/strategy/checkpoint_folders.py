"""Strategy checkpoints in the toolkit's atomic folder format (`workers/checkpoint_format.py`).

Rank 0 runs the folder protocol (temporary folder, manifest written last, rename, `keep` pruning); every
rank writes its own shards into the temporary folder in between, so the folder is renamed only after all
shards are on disk.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from workers.checkpoint_format import MANIFEST_FILE, find_resume_dir, save_checkpoint


def _shared(value: Any) -> Any:
    """Rank 0's `value` on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save(
    root: str, step: int, client_state: dict[str, Any], keep: int | None, write_shards: Callable[[str], None]
) -> str:
    def write_everyone(tmp: Path) -> None:
        write_shards(str(_shared(str(tmp))))  # the other ranks join here, once the folder exists

    if dist.get_rank() == 0:
        final = str(save_checkpoint(root, step, client_state, write_everyone, keep=keep))
    else:
        write_shards(_shared(None))
        final = None
    return _shared(final)  # every rank returns once the folder has its final name


def resolve(path: Path) -> Path | None:
    """A step folder as it is (checked whole), or the newest whole step folder under a root (None: none there)."""
    if (path / MANIFEST_FILE).is_file() or path.name.startswith("global_step_"):
        return find_resume_dir(path.parent, str(path), warn=False)
    return find_resume_dir(path, "auto")
