"""The choices of the data section's settings, torch-free: the config check reads them before torch loads."""

from __future__ import annotations

# data.truncation: what a prompt longer than data.max_prompt_length gets (trainer/data/rl_dataset.py)
TRUNCATION_MODES: tuple[str, ...] = ("error", "left", "right", "filter")
