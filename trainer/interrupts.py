"""Ctrl-C of a run: the workers are released first, then one line says where the run stopped and which
checkpoint a rerun resumes from (the command line prints it and exits with 130, the shell's code for SIGINT)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

EXIT_CODE = 130


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run, raised once its workers were released; `last_step` is the last step it logged."""

    def __init__(self, last_step: int) -> None:
        super().__init__(last_step)
        self.last_step = last_step


def _last_checkpoint(cfg: DictConfig) -> str:
    from trainer.checkpointing import CheckpointError, find_resume_dir

    root = OmegaConf.select(cfg, "trainer.default_local_dir")
    mode = str(OmegaConf.select(cfg, "trainer.resume_mode", default="auto"))
    try:
        path = find_resume_dir(root, "auto", warn=False) if root else None
    except CheckpointError:
        path = None
    if path is None:
        return "no checkpoint yet (a rerun starts at step 0)"
    rerun = "resume with the same command" if mode == "auto" else "resume from it with trainer.resume_mode=auto"
    return f"last checkpoint: {path.resolve()} ({rerun})"


def interrupted_message(cfg: DictConfig | None, interrupt: KeyboardInterrupt) -> str:
    """The one line printed for a Ctrl-C: the step reached (when the run got that far) and the last checkpoint."""
    # A plain KeyboardInterrupt: before the run started its loop, or a second Ctrl-C while it released its workers.
    where = f"stopped at step {interrupt.last_step}" if isinstance(interrupt, RunInterrupted) else "stopped"
    if cfg is None:
        return f"interrupted: {where}"
    return f"interrupted: {where}; {_last_checkpoint(cfg)}"
