"""`trainer.on_node_loss` / `trainer.on_node_join`: what a run does when a node holding its workers is lost or a
node joins (trainer/node_changes.py does it). Read before Ray starts, so this module imports neither Ray nor torch."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

ON_NODE_LOSS_CHOICES: tuple[str, ...] = ("stop", "continue")  # trainer.on_node_loss
ON_NODE_JOIN_CHOICES: tuple[str, ...] = ("ignore", "grow")  # trainer.on_node_join


@dataclass(frozen=True)
class NodePolicy:
    """What the run does when a node holding its workers is lost, and when a node joins the cluster."""

    continue_on_loss: bool
    grow_on_join: bool
    full_nnodes: int  # trainer.nnodes as configured: a run grows back up to it, never past

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "NodePolicy":
        trainer = cfg.trainer
        return cls(
            continue_on_loss=trainer.get("on_node_loss", "stop") == "continue",
            grow_on_join=trainer.get("on_node_join", "ignore") == "grow",
            full_nnodes=int(trainer.nnodes),
        )


def node_policy_problem(cfg: DictConfig) -> str | None:
    """A node setting that cannot work as configured, in the user's keys (checked before Ray starts)."""
    trainer = cfg.trainer
    if trainer.get("on_node_join", "ignore") == "grow" and trainer.get("on_node_loss", "stop") != "continue":
        return (
            "trainer.on_node_join=grow takes back nodes that a run lost and went on without, which needs "
            "trainer.on_node_loss=continue (it is 'stop': the run ends at the first lost node); set both, or "
            "trainer.on_node_join=ignore"
        )
    return None

