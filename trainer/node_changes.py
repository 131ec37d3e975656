"""A run that outlives a lost node (`trainer.on_node_loss=continue`) and takes a node back (`on_node_join=grow`).

The driver rebuilds the worker groups on the nodes it has, reloads the newest whole checkpoint (resharded by
torch.distributed.checkpoint to the new world size) and goes on in the same job; see docs/multi_node.md.
Peers restart the whole job from its last checkpoint instead, which needs every node back.
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable

import ray
from omegaconf import DictConfig

from single_controller.errors import NodeLostError
from single_controller.ray import RayWorkerGroup
from single_controller.ray.node_loss import LostNode, find_lost_nodes
from trainer.batch_checks import batch_split_problems
from trainer.checkpointing import find_resume_dir
from trainer.input_errors import InputError
from trainer.node_policy import NodePolicy
from trainer.preflight import resume_step
from trainer.role_groups import use_gpu
from trainer.run_data import RunData
from trainer.tracking import Tracker


def lost_trainer_nodes(actor: RayWorkerGroup) -> list[LostNode]:
    """The nodes Ray declared dead that held actor ranks, whichever group's call noticed the loss (none when
    only the separate engines' node went)."""
    return find_lost_nodes(actor.node_info)


def pool_nodes_of(lost: list[LostNode], cfg: DictConfig) -> int:
    """How many of the trainer's pool nodes (`trainer.n_gpus_per_node` ranks each) the lost ranks made up."""
    return -(-sum(len(node.ranks) for node in lost) // int(cfg.trainer.n_gpus_per_node))


def config_on_nodes(cfg: DictConfig, nnodes: int) -> DictConfig:
    """`cfg` for `nnodes` pool nodes, resuming from the newest whole checkpoint of the run. Raises InputError
    (one line naming every problem) when the step's batch does not split over that many workers."""
    if nnodes < 1:
        raise InputError(
            f"every node of the run's {cfg.trainer.nnodes} pool nodes (trainer.nnodes) is lost; nothing is left to "
            "continue on. The last whole checkpoint is kept: start the run again when nodes are back"
        )
    smaller = copy.deepcopy(cfg)
    smaller.trainer.nnodes = nnodes
    smaller.trainer.resume_mode = "auto"
    problems = batch_split_problems(smaller)
    if problems:
        raise InputError(
            f"cannot go on with trainer.nnodes={nnodes} after the node loss: " + "; and ".join(problems)
            + ". The last whole checkpoint is kept: resume it with settings that split over the workers left"
        )
    return smaller


def free_pool_nodes(cfg: DictConfig, groups: list[RayWorkerGroup]) -> int:
    """Alive Ray nodes that hold none of the run's workers yet could hold one pool node (`n_gpus_per_node`
    processes of `gpus_per_process` GPUs or one CPU each): what a growing run can take."""
    used = {info.node_id for group in groups for info in group.node_info}
    per_node = int(cfg.trainer.n_gpus_per_node)
    need = {"CPU": float(per_node)}
    if use_gpu(cfg):
        need["GPU"] = per_node * float(cfg.trainer.get("gpus_per_process", 1))
    return sum(
        1
        for node in ray.nodes()
        if node.get("Alive")
        and node["NodeID"] not in used
        and all(node["Resources"].get(kind, 0.0) >= amount for kind, amount in need.items())
    )


class NodeChanges:
    """The launcher's side of trainer.on_node_loss / on_node_join: the run's current config (its `nnodes`
    changes), and the rebuild of the worker groups and the tracker after a loss or a join."""

    def __init__(self, cfg: DictConfig, data: RunData, build_roles: Callable[[DictConfig], Any], open_tracker: Any):
        self.cfg = cfg
        self.policy = NodePolicy.from_config(cfg)
        self.data, self.build_roles, self.open_tracker = data, build_roles, open_tracker
        # Where the run started: with no checkpoint yet, a loss starts the prompts over from here.
        self.first_loader_state = data.train_loader.state_dict()

    @property
    def nnodes(self) -> int:
        return int(self.cfg.trainer.nnodes)

    def join_check(self, roles: Any) -> Callable[[], bool] | None:
        """What the loop asks after each checkpoint (None when the run cannot grow): is a node free to take?"""
        if not self.policy.grow_on_join or self.nnodes >= self.policy.full_nnodes:
            return None
        return lambda: free_pool_nodes(self.cfg, roles.groups) > 0

    def after_loss(self, error: NodeLostError, roles: Any, tracker: Tracker) -> tuple[Any, Tracker]:
        """Report the loss, then the worker groups on the nodes left, from the newest whole checkpoint."""
        lost = lost_trainer_nodes(roles.actor)
        smaller = config_on_nodes(self.cfg, self.nnodes - pool_nodes_of(lost, self.cfg))  # InputError: a clean stop
        described = "; ".join(node.describe() for node in lost) or f"nodes {sorted(error.lost_nodes)} were lost"
        print(
            f"node loss (trainer.on_node_loss=continue), noticed in {error.group}.{error.method}: {described}\n"
            f"continuing on {smaller.trainer.nnodes} of {self.policy.full_nnodes} nodes (trainer.nnodes) from "
            f"{self._resume_point(smaller)}",
            file=sys.stderr, flush=True,
        )
        return self._rebuild(smaller, roles, tracker)

    def after_join(self, roles: Any, tracker: Tracker) -> tuple[Any, Tracker]:
        """The worker groups on the nodes the run had plus those that joined, from the checkpoint just saved."""
        more = min(self.policy.full_nnodes, self.nnodes + free_pool_nodes(self.cfg, roles.groups))
        larger = config_on_nodes(self.cfg, more)
        print(
            f"node join (trainer.on_node_join=grow): growing from {self.nnodes} to {more} of "
            f"{self.policy.full_nnodes} nodes from {self._resume_point(larger)}",
            file=sys.stderr, flush=True,
        )
        return self._rebuild(larger, roles, tracker)

    @staticmethod
    def _resume_point(cfg: DictConfig) -> str:
        path = find_resume_dir(cfg.trainer.default_local_dir, "auto", warn=False)
        return f"checkpoint {path}" if path else "step 0 (no checkpoint was saved: trainer.save_freq)"

    def _rebuild(self, cfg: DictConfig, roles: Any, tracker: Tracker) -> tuple[Any, Tracker]:
        roles.shutdown()
        step = resume_step(cfg) or 0
        if step == 0:  # nothing to resume: the new loop starts on the run's first prompts again
            self.data.train_loader.load_state_dict(self.first_loader_state)
        # The steps past the checkpoint are trained again: every backend drops what it logged of them.
        kept = [record for record in tracker.history if record["step"] <= step]
        tracker.close()
        tracker = self.open_tracker(step)
        tracker.history = kept
        tracker.set_counts(self.data.prompt_counts)
        self.cfg = cfg
        return self.build_roles(cfg), tracker
