"""Run any RL loop from its config: assets, checks, Ray, data, worker groups, the loop, clean release."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from omegaconf import DictConfig

from trainer.interrupts import RunInterrupted

if TYPE_CHECKING:  # the modules themselves load after the input checks: a bad path fails before torch loads
    from trainer.run_data import RunData
    from trainer.step_loop import StepLoop
    from trainer.tracking import Tracker

BuildRoles = Callable[[DictConfig], Any]  # returns an object with .actor, .save, .load, .shutdown
MakeLoop = Callable[[DictConfig, Any, "RunData", "Tracker"], "StepLoop"]
OpenTracker = Callable[[int | None], "Tracker"]  # a run's tracker, replacing what it logged past the given step


def run_loop(cfg: DictConfig, build_roles: BuildRoles, make_loop: MakeLoop) -> list[dict[str, Any]]:
    """Build everything `cfg` names, run `make_loop(...).fit()`, and always release the workers."""
    from trainer.preflight import check_inputs, check_plan_inputs, memory_plan_text
    from trainer.run_setup import driver_threads, ensure_default_assets

    ensure_default_assets(cfg)
    if cfg.trainer.get("plan_only", False):  # the memory plan, like `--cfg job`: printed, nothing started
        check_plan_inputs(cfg)  # a plan of settings that a run would refuse says so first
        print(memory_plan_text(cfg))
        return []
    # Bad paths, columns and settings, and a plan that does not fit the GPU, fail here, in seconds, before Ray starts.
    steps_set = cfg.trainer.get("total_training_steps") is not None
    nothing_to_do = check_inputs(cfg)  # "nothing to train" is decided here when the step count is set
    if nothing_to_do:
        print(nothing_to_do, file=sys.stderr)
        return []
    from trainer.preflight import nothing_to_train
    from trainer.run_data import build_run_data
    from trainer.step_count import resolve_training_steps

    with driver_threads(cfg):
        data = build_run_data(cfg)  # before Ray and the tracker: the step count needs the prompts left after filtering
    resolve_training_steps(cfg, len(data.train_loader))
    nothing_to_do = None if steps_set else nothing_to_train(cfg)
    if nothing_to_do:
        print(nothing_to_do, file=sys.stderr)
        return []
    print(f"checkpoints and logs: {Path(cfg.trainer.default_local_dir).resolve()}")
    from omegaconf import OmegaConf

    from trainer.data_counts import StepCountsTracker
    from trainer.preflight import resume_step

    log_dir = Path(cfg.trainer.default_local_dir) / "logs"
    start_step = resume_step(cfg)

    def open_tracker(resume_from: int | None) -> StepCountsTracker:
        # Started before Ray: a tracker that cannot start (wandb without an account) fails in seconds. It
        # replaces or skips what a stopped run logged past the checkpoint this run resumes from.
        return StepCountsTracker(
            cfg.trainer.logger, log_dir, project_name=cfg.trainer.project_name,
            experiment_name=cfg.trainer.experiment_name, config=OmegaConf.to_container(cfg, resolve=True),
            resume_step=resume_from,
        )

    tracker = open_tracker(start_step)
    with driver_threads(cfg):
        history = _build_and_fit(cfg, data, build_roles, make_loop, tracker, open_tracker, start_step, log_dir)
    print(outputs_text(cfg))
    return history


def _build_and_fit(
    cfg: DictConfig, data: "RunData", build_roles: BuildRoles, make_loop: MakeLoop, tracker: "Tracker",
    open_tracker: OpenTracker, start_step: int | None, log_dir: Path,
) -> list[dict[str, Any]]:
    """Ray and the worker groups, then the loop; the tracker closes and the workers go in any case. With
    trainer.on_node_loss=continue (and on_node_join=grow) the loop starts again on the nodes the run has now."""
    from single_controller.errors import NodeLostError
    from trainer.node_changes import NodeChanges
    from trainer.run_setup import init_ray
    from trainer.step_loop import StepLoop

    try:
        init_ray(cfg)
        tracker.set_counts(data.prompt_counts)
        roles = build_roles(cfg)  # gives back what it reserved when it fails
    except KeyboardInterrupt:
        tracker.close()
        raise RunInterrupted(start_step or 0) from None
    except BaseException:
        tracker.close()
        raise
    nodes = NodeChanges(cfg, data, build_roles, open_tracker)
    try:
        while True:
            loop = make_loop(nodes.cfg, roles, data, tracker)
            # A loop of the user's own that is not a StepLoop runs as it is: it cannot stop to grow.
            can_grow = isinstance(loop, StepLoop)
            if can_grow:
                loop.stop_at_checkpoint = nodes.join_check()
            try:
                history = loop.fit()
            except NodeLostError as error:
                if not nodes.policy.continue_on_loss:
                    raise
                roles, tracker = nodes.after_loss(error, roles, tracker)
                continue
            if not (can_grow and loop.stopped_at_checkpoint):
                break
            roles, tracker = nodes.after_join(roles, tracker)
        curve = tracker.plot_reward_curve(log_dir / "reward_curve.png")
        if curve:
            print(f"reward curve: {curve}")
        if cfg.trainer.export_hf_at_end:
            roles.actor.export_hf(str(export_dir(cfg)))
        from trainer.role_groups import RoleGroups

        if isinstance(roles, RoleGroups):  # a run that ended well: the workers tidy up before `finally` kills them
            roles.close()  # (roles of a user's own build_roles need only `shutdown`)
    except KeyboardInterrupt:
        # The command line prints one line (the step, the last checkpoint) once `finally` released the workers.
        last_step = max((record["step"] for record in tracker.history), default=start_step or 0)
        raise RunInterrupted(last_step) from None
    finally:
        tracker.close()
        roles.shutdown()
    return history


def export_dir(cfg: DictConfig) -> Path:
    return Path(cfg.trainer.default_local_dir).resolve() / "hf_export"


def outputs_text(cfg: DictConfig) -> str:
    """Where a finished run left its checkpoint and its Hugging Face export."""
    from trainer.checkpointing import find_resume_dir

    checkpoint = find_resume_dir(cfg.trainer.default_local_dir, "auto", warn=False)
    saved = checkpoint.resolve() if checkpoint else "none (trainer.save_at_end=false)"
    lines = [f"last checkpoint: {saved}"]
    if cfg.trainer.export_hf_at_end:
        lora = cfg.actor_rollout_ref.model.get("lora_rank")
        adapter = " (the merged model; the LoRA adapter alone in lora_adapter/)" if lora else ""
        lines.append(f"Hugging Face export: {export_dir(cfg)}{adapter}")
    return "\n".join(lines)
