"""How much free memory a GPU worker's caching allocator may keep reserved beyond its peak, and when the workers
check it. Free of torch: the memory plan (trainer/memory_plan/plan.py) and the config checks use the same values
the workers apply (workers/cached_blocks.py)."""

from __future__ import annotations

# Reserved device memory beyond the allocator's peak above this is handed back (see release_cached_blocks).
CACHED_BLOCKS_LIMIT = 1 << 30

# trainer.release_cached_blocks: after every micro-batch (the device's use follows the micro-batches' peak, as the
# memory plan counts it) or only after each phase's last micro-batch (inside a phase the allocator keeps its blocks
# for the next micro-batch and gives them back itself when an allocation would otherwise fail).
AFTER_MICRO_BATCH = "after_micro_batch"
AFTER_PHASE = "after_phase"
RELEASE_POINTS = (AFTER_MICRO_BATCH, AFTER_PHASE)
