"""The training logic every backend runs: the PPO schedule and loop, the DPO and SFT updates, the actor's loss.

It speaks to a model only through `TrainBackend` (workers/training/backend.py), which the FSDP2 engine
(workers/fsdp/backend.py) and the megatron-core engine (workers/megatron/backend.py) implement.
"""
