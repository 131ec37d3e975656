"""How much free memory a GPU worker's caching allocator may keep reserved beyond its peak between
micro-batches. Free of torch: the memory plan (trainer/memory_plan/plan.py) counts the same limit the workers
apply (workers/cached_blocks.py)."""

from __future__ import annotations

# Reserved device memory beyond the allocator's peak above this is handed back (see release_cached_blocks).
CACHED_BLOCKS_LIMIT = 1 << 30
