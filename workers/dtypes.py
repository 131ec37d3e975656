"""The compute dtypes a worker takes by name (one list for the worker config, strategy/ and the model loader)."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# "auto": bfloat16 on a GPU, float32 on the CPU (workers/fsdp/model_loading.compute_dtype)
DTYPE_NAMES: tuple[str, ...] = ("auto", *TORCH_DTYPES)
