"""How many steps a run trains, verl's rule: `trainer.total_training_steps` when set, else the batches of one
epoch x `trainer.total_epochs`.

The batches of an epoch are what the training dataloader yields before it starts the next epoch (in a fresh
order): the prompts left after length filtering, divided by the prompts it draws at once (data.gen_batch_size,
or data.train_batch_size when that is null), the last partial batch dropped. With algorithm.filter_groups a
step may draw more than one batch, so such a run can pass over the data more often than total_epochs says,
as in verl. The count is resolved once, on the driver, as soon as the data is loaded, and written into the
config: the step loop, the optimizers' schedules, the progress bar and the resume checks all read that number.
"""

from __future__ import annotations

from omegaconf import DictConfig


def batches_per_epoch(prompts: int, batch_size: int) -> int:
    """Whole batches in one pass over `prompts` (the dataloader drops the last partial one)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return prompts // batch_size


def total_training_steps(explicit: int | None, epochs: int, per_epoch: int) -> int:
    """`explicit` when set (not None), else `per_epoch` x `epochs`."""
    return int(explicit) if explicit is not None else per_epoch * epochs


def resolve_training_steps(cfg: DictConfig, per_epoch: int) -> int:
    """Write the run's step count into `cfg.trainer.total_training_steps` (kept when already set) and say where
    it came from; `per_epoch` is len(train dataloader)."""
    trainer = cfg.trainer
    explicit = trainer.get("total_training_steps")
    epochs = int(trainer.get("total_epochs", 1))
    steps = total_training_steps(explicit, epochs, per_epoch)
    if steps < 1:  # per_epoch is >= 1 (the dataloader refuses fewer prompts than a batch) and epochs >= 1
        raise ValueError(f"trainer.total_training_steps resolved to {steps}; it must be >= 1")
    trainer.total_training_steps = steps
    if explicit is None:
        print(f"training steps: {steps} ({per_epoch} batches per epoch x trainer.total_epochs={epochs})")
    else:
        print(f"training steps: {steps} (trainer.total_training_steps; {per_epoch} batches per epoch)")
    return steps
