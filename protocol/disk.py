"""Save/load a DataProto as ONE safetensors file. No pickle: loading never executes code.

File layout
-----------
* Tensors (safetensors entries):
    batch tensors               -> "batch" + SEP + SEP.join(nested key path)
    numeric non_tensor_batch    -> "non_tensor" + SEP + key   (dtype kinds b/i/u/f/c)
  SEP is "\\x1f" (ASCII unit separator), a control character that does not occur in real
  key names; saving a batch key that contains it is refused.
* Header metadata["dataproto"]: one JSON document (see protocol.json_codec for the tagged
  encoding) with the format version, the batch layout (batch size, nested TensorDicts,
  leaf order), how each non_tensor_batch key is stored (object and string arrays are
  JSON-encoded inline), and meta_info.

Tensors are written from CPU; loaded tensors are on CPU. Files are written atomically
(temporary file in the target directory, then os.replace).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tensordict import TensorDictBase

from protocol._tensordict_utils import TensorDictLayout, build_tensordict, flatten_tensordict
from protocol.json_codec import decode_array, decode_value, encode_array, encode_value

SEP = "\x1f"
BATCH_PREFIX = "batch" + SEP
NON_TENSOR_PREFIX = "non_tensor" + SEP
METADATA_KEY = "dataproto"
FORMAT_VERSION = 1
# safetensors refuses headers over 100 MB; keep room for the tensor index.
MAX_HEADER_BYTES = 90_000_000

# dtypes safetensors can store.
_STORABLE = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.float8_e4m3fn, torch.float8_e5m2,
}


class DataProtoFileError(ValueError):
    """The file is not a readable DataProto safetensors file."""


def write_dataproto_file(
    batch: TensorDictBase,
    non_tensor_batch: dict[str, np.ndarray],
    meta_info: dict[str, Any],
    path: str | os.PathLike[str],
) -> None:
    """Write a DataProto's three parts to `path` atomically (see module docstring for the format)."""
    tensors: dict[str, torch.Tensor] = {}
    layout, leaves = flatten_tensordict(batch)
    for key_path, tensor in leaves:
        if any(SEP in part for part in key_path):
            raise ValueError(f"batch key {key_path!r} contains the reserved separator {SEP!r}")
        tensors[BATCH_PREFIX + SEP.join(key_path)] = _storable(".".join(key_path), tensor)

    non_tensor: dict[str, Any] = {}
    for key, array in non_tensor_batch.items():
        if array.dtype.kind in "biufc":
            native = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
            tensors[NON_TENSOR_PREFIX + key] = _storable(f"non_tensor_batch[{key!r}]", torch.from_numpy(native))
            non_tensor[key] = {"tensor": native.dtype.str}
        else:
            non_tensor[key] = {"json": encode_array(array, f"non_tensor_batch[{key!r}]")}

    header = {
        "format": "DataProto",
        "version": FORMAT_VERSION,
        "batch": {
            "batch_size": layout.batch_size,
            "nested": [[list(p), bs] for p, bs in layout.nested],
            "leaves": [list(p) for p, _ in leaves],
        },
        "non_tensor_batch": non_tensor,
        "meta_info": encode_value(meta_info, "meta_info"),
    }
    encoded = json.dumps(header, separators=(",", ":"))
    if len(encoded.encode()) > MAX_HEADER_BYTES:
        raise ValueError(
            f"non_tensor_batch object/string arrays and meta_info encode to {len(encoded.encode()) / 1e6:.0f} MB "
            f"of JSON, over the {MAX_HEADER_BYTES / 1e6:.0f} MB that a safetensors header may hold; "
            "save the data in smaller pieces (e.g. data.split(...))"
        )
    _write_atomically(_unshare(tensors), {METADATA_KEY: encoded}, path)


def read_dataproto_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file written by write_dataproto_file as DataProto's constructor arguments (batch,
    non_tensor_batch, meta_info); malformed files raise DataProtoFileError."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no DataProto file at {os.fspath(path)!r}")
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
        tensors = load_file(path)
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise DataProtoFileError(f"{os.fspath(path)!r} is not a valid safetensors file: {exc}") from exc
    if METADATA_KEY not in metadata:
        raise DataProtoFileError(
            f"{os.fspath(path)!r} is a safetensors file but not a DataProto file (no {METADATA_KEY!r} metadata)"
        )
    try:
        header = json.loads(metadata[METADATA_KEY])
        return _decode(header, tensors)
    except DataProtoFileError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise DataProtoFileError(f"{os.fspath(path)!r} has malformed DataProto metadata: {exc}") from exc


def _decode(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    if header.get("format") != "DataProto" or header.get("version") != FORMAT_VERSION:
        raise DataProtoFileError(
            f"unsupported DataProto file format/version: {header.get('format')!r}/{header.get('version')!r}"
        )
    batch_header = header["batch"]
    layout = TensorDictLayout(
        batch_size=[int(n) for n in batch_header["batch_size"]],
        nested=[(tuple(p), [int(n) for n in bs]) for p, bs in batch_header["nested"]],
    )
    leaves = []
    expected_names = set()
    for path in batch_header["leaves"]:
        name = BATCH_PREFIX + SEP.join(path)
        leaves.append((tuple(path), _take(tensors, name)))
        expected_names.add(name)

    non_tensor_batch: dict[str, np.ndarray] = {}
    for key, spec in header["non_tensor_batch"].items():
        if "tensor" in spec:
            name = NON_TENSOR_PREFIX + key
            non_tensor_batch[key] = _take(tensors, name).numpy().astype(np.dtype(spec["tensor"]), copy=False)
            expected_names.add(name)
        else:
            non_tensor_batch[key] = decode_array(spec["json"])

    unexpected = sorted(set(tensors) - expected_names)
    if unexpected:
        raise DataProtoFileError(f"file has tensors not described by its metadata: {unexpected[:10]}")
    meta_info = decode_value(header["meta_info"])
    if not isinstance(meta_info, dict):
        raise DataProtoFileError("meta_info in the file is not a dict")
    return {"batch": build_tensordict(layout, leaves), "non_tensor_batch": non_tensor_batch, "meta_info": meta_info}


def _take(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise DataProtoFileError(f"file metadata names tensor {name!r} but the file does not contain it")
    return tensors[name]


def _storable(where: str, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype not in _STORABLE:
        raise TypeError(f"{where} has dtype {tensor.dtype}, which safetensors cannot store")
    return tensor.detach().to("cpu").contiguous()


def _unshare(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors sharing a storage (e.g. two slices of one buffer): copy repeats."""
    seen: set[int] = set()
    out = {}
    for name, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            tensor = tensor.clone()
        seen.add(ptr)
        out[name] = tensor
    return out


def _write_atomically(tensors: dict[str, torch.Tensor], metadata: dict[str, str], path: str | os.PathLike[str]) -> None:
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())  # data on disk before the rename makes it visible
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
