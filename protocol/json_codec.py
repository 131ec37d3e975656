"""Tagged JSON encoding for non-tensor data in DataProto files (no pickle anywhere).

Encoding rules (encode_value -> JSON-compatible value):
  * None, bool, int, float, str      -> themselves (NaN/inf use Python's json extension)
  * list and tuple                   -> JSON array (tuples come back as lists)
  * dict with str keys               -> {"dict": {key: encoded value}}
  * numpy scalar                     -> the equivalent Python scalar
  * numpy array                      -> {"ndarray": {"dtype": str, "shape": [...], "data": [...]}}
Every JSON object in the output is a one-key tag, so decoding is unambiguous. Anything
else raises TypeError naming where the value sits (e.g. non_tensor_batch['x'][3]['k']).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol.arrays import to_object_array

SUPPORTED = "str, int, float, bool, None, list, tuple, dict with str keys, numpy scalars and arrays"


def encode_value(value: Any, where: str) -> Any:
    """Encode value; `where` describes its location for error messages."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # IntEnum and friends become plain ints
    if isinstance(value, float):
        return float(value)
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return value.item()
    if isinstance(value, (list, tuple)):
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(
                    f"cannot encode {where}: dict key {k!r} is {type(k).__name__}, only str keys are supported"
                )
            out[k] = encode_value(v, f"{where}[{k!r}]")
        return {"dict": out}
    if isinstance(value, np.ndarray):
        return {"ndarray": encode_array(value, where)}
    raise TypeError(f"cannot encode {where} of type {type(value).__name__}; supported: {SUPPORTED}")


def encode_array(array: np.ndarray, where: str) -> dict[str, Any]:
    """Encode an array element by element so each error names the element index."""
    if array.dtype.kind not in "biufUO":
        raise TypeError(f"cannot encode {where}: numpy dtype {array.dtype} is not supported; supported: {SUPPORTED}")
    flat = array.ravel()
    data = [
        encode_value(flat[i] if array.dtype == object else flat[i].item(), f"{where}[{i}]") for i in range(flat.size)
    ]
    return {"dtype": array.dtype.str if array.dtype != object else "object", "shape": list(array.shape), "data": data}


def decode_value(value: Any) -> Any:
    """Inverse of encode_value; raises ValueError on anything encode_value cannot produce."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        (tag, body), = value.items()
        if tag == "dict" and isinstance(body, dict):
            return {k: decode_value(v) for k, v in body.items()}
        if tag == "ndarray" and isinstance(body, dict):
            return decode_array(body)
    raise ValueError(f"malformed encoded value: {str(value)[:200]}")


def decode_array(body: dict[str, Any]) -> np.ndarray:
    try:
        dtype, shape, data = body["dtype"], body["shape"], body["data"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed encoded array: {str(body)[:200]}") from exc
    items = [decode_value(v) for v in data]
    array = to_object_array(items) if dtype == "object" else np.array(items, dtype=np.dtype(dtype))
    try:
        return array.reshape(shape)
    except ValueError as exc:
        raise ValueError(f"malformed encoded array: {len(items)} elements do not fit shape {shape}") from exc
