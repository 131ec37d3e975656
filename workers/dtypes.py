"""The compute dtypes a worker takes by name (one list for the worker config, strategy/ and the model loader).

Names only: the config check imports this without torch (tests/test_import_graph.py)."""

from __future__ import annotations

# torch.<name> for each; "auto" is bfloat16 on a GPU, float32 on the CPU (workers/fsdp/model_loading.compute_dtype)
COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DTYPE_NAMES: tuple[str, ...] = ("auto", *COMPUTE_DTYPES)
