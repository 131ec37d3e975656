"""`trainer.cuda_alloc_conf`: the CUDA caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF) of every GPU worker.

With `expandable_segments:True` the allocator grows mapped ranges instead of keeping blocks of fixed sizes, meant
for micro-batches of different token counts. vLLM's sleep-mode pool turns the setting off around its own memory and
back on after, so a colocated engine keeps working. Measured at 7B on two H200s it slowed the update (30.6% MFU vs
40.0%) while the workers empty the cache after every micro-batch (trainer.release_cached_blocks), since each emptying
then also unmaps pages: docs/benchmarks.md.
"""

from __future__ import annotations

from omegaconf import DictConfig

ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_CONF_KEY = "trainer.cuda_alloc_conf"


def alloc_conf_problem(value: object) -> str:
    """Why `value` is not a valid setting ("" when it is): null, or comma-separated `name:value` entries."""
    if value is None:
        return ""
    entries = value.split(",") if isinstance(value, str) else []
    if entries and all(
        len(entry.split(":")) == 2 and all(part.strip() for part in entry.split(":")) for entry in entries
    ):
        return ""
    return (
        f"{ALLOC_CONF_KEY}={value!r} must be null (keep the workers' environment) or PyTorch's allocator settings as "
        "comma-separated name:value entries, e.g. 'expandable_segments:True'"
    )


def gpu_worker_env(cfg: DictConfig, gpu: bool) -> dict[str, str]:
    """The environment variables the setting gives each worker: none on CPU or when null."""
    conf = cfg.trainer.get("cuda_alloc_conf")
    return {ALLOC_CONF_VAR: conf} if gpu and conf else {}
