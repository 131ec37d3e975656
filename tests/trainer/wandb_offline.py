"""Read what an offline wandb run recorded (its `run-<id>.wandb` file), so tests check what wandb received.

The file is wandb's transaction log: a 7-byte header (":W&B", magic, version), then records in the LevelDB
log layout (32 KiB blocks; each chunk has a 4-byte checksum, 2-byte length, 1-byte type: full, first,
middle, last), each record a `wandb_internal_pb2.Record`."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

HEADER_BYTES = 7
BLOCK_BYTES = 32 * 1024
CHUNK_HEADER_BYTES = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    assert data[:4] == b":W&B", "not a wandb transaction log"
    position, pending = HEADER_BYTES, b""
    while position + CHUNK_HEADER_BYTES <= len(data):
        left_in_block = BLOCK_BYTES - position % BLOCK_BYTES
        if left_in_block < CHUNK_HEADER_BYTES:  # the block's tail is padding
            position += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + CHUNK_HEADER_BYTES])
        chunk = data[position + CHUNK_HEADER_BYTES : position + CHUNK_HEADER_BYTES + length]
        position += CHUNK_HEADER_BYTES + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
        else:  # zero padding at the end of a file still being written
            break


def offline_runs(wandb_dir: Path, run_id: str) -> list[dict[str, Any]]:
    """Each offline run folder of `run_id`, oldest first: its project, name, config and logged history."""
    from wandb.proto import wandb_internal_pb2

    runs = []
    # Two runs started within one second share a folder name, so wandb adds "-1" to the second's.
    for log in sorted(Path(wandb_dir).glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb")):
        run: dict[str, Any] = {"history": [], "config": {}}
        for payload in _payloads(log.read_bytes()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.update(project=record.run.project, name=record.run.display_name, id=record.run.run_id)
                run["config"].update({item.key: json.loads(item.value_json) for item in record.run.config.update})
            elif kind == "config":
                run["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
            elif kind == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                run["history"].append(items)
        runs.append(run)
    return runs
