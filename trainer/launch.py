"""Run any RL loop from its config: assets, checks, Ray, data, worker groups, the loop, clean release."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from omegaconf import DictConfig

if TYPE_CHECKING:  # the modules themselves load after the input checks: a bad path fails before torch loads
    from trainer.run_data import RunData
    from trainer.step_loop import StepLoop
    from trainer.tracking import Tracker

BuildRoles = Callable[[DictConfig], Any]  # returns an object with .actor, .save, .load, .shutdown
MakeLoop = Callable[[DictConfig, Any, "RunData", "Tracker"], "StepLoop"]


def run_loop(cfg: DictConfig, build_roles: BuildRoles, make_loop: MakeLoop) -> list[dict[str, Any]]:
    """Build everything `cfg` names, run `make_loop(...).fit()`, and always release the workers."""
    from trainer.preflight import check_inputs, memory_plan_text
    from trainer.run_setup import ensure_default_assets, init_ray

    ensure_default_assets(cfg)
    if cfg.trainer.get("plan_only", False):  # the memory plan, like `--cfg job`: printed, nothing started
        print(memory_plan_text(cfg))
        return []
    # Bad paths, columns and settings, and a plan that does not fit the GPU, fail here, in seconds, before Ray starts.
    nothing_to_do = check_inputs(cfg)
    if nothing_to_do:
        print(nothing_to_do, file=sys.stderr)
        return []
    print(f"checkpoints and logs: {Path(cfg.trainer.default_local_dir).resolve()}")
    from omegaconf import OmegaConf

    from trainer.data_counts import StepCountsTracker
    from trainer.preflight import resume_step
    from trainer.run_data import build_run_data

    log_dir = Path(cfg.trainer.default_local_dir) / "logs"
    # Started before Ray: a tracker that cannot start (wandb without an account) fails in seconds. It
    # replaces or skips what a stopped run logged past the checkpoint this run resumes from.
    tracker = StepCountsTracker(
        cfg.trainer.logger, log_dir, project_name=cfg.trainer.project_name, experiment_name=cfg.trainer.experiment_name,
        config=OmegaConf.to_container(cfg, resolve=True), resume_step=resume_step(cfg),
    )
    try:
        init_ray(cfg)
        data = build_run_data(cfg)
        tracker.set_counts(data.prompt_counts)
        roles = build_roles(cfg)  # gives back what it reserved when it fails
    except BaseException:
        tracker.close()
        raise
    try:
        history = make_loop(cfg, roles, data, tracker).fit()
        curve = tracker.plot_reward_curve(log_dir / "reward_curve.png")
        if curve:
            print(f"reward curve: {curve}")
        if cfg.trainer.export_hf_at_end:
            roles.actor.export_hf(str(Path(cfg.trainer.default_local_dir) / "hf_export"))
    except KeyboardInterrupt:
        print("interrupted: stopping the workers and releasing their placement groups", file=sys.stderr, flush=True)
        raise
    finally:
        tracker.close()
        roles.shutdown()
    return history
