"""`python -m tests.reliability.pause_in_save STEP MARKER [overrides...]`: `trainer.main`, except that the
save of step STEP stops just before its manifest is written (every shard and the driver state are
already in the temporary folder) after writing MARKER, so a test can kill -9 the run mid-save."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from trainer.main import main
from workers import checkpoint_format


def pausing(write_manifest: Callable[[Path, int], Path], step: int, marker: Path) -> Callable[[Path, int], Path]:
    def write_manifest_or_pause(folder: Path, at_step: int) -> Path:
        if at_step == step:
            marker.write_text(str(folder))
            time.sleep(3600)  # killed here
        return write_manifest(folder, at_step)

    return write_manifest_or_pause


if __name__ == "__main__":
    step, marker, *overrides = sys.argv[1:]
    checkpoint_format.write_manifest = pausing(checkpoint_format.write_manifest, int(step), Path(marker))
    sys.exit(main(overrides))
