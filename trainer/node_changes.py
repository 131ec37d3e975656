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
from ray.util.placement_group import placement_group, remove_placement_group

from single_controller.errors import NodeLostError
from single_controller.ray import RayWorkerGroup
from single_controller.ray.node_loss import LostNode, find_lost_nodes
from trainer.batch_checks import batch_split_problems
from trainer.checkpointing import find_resume_dir
from trainer.input_errors import InputError
from trainer.node_policy import NodePolicy
from trainer.preflight import check_memory, resume_step
from trainer.role_groups import use_gpu
from trainer.run_data import RunData
from trainer.tracking import Tracker

FREE_NODE_PROBE_S = 2.0  # how long a join check waits for a pool node's worth of resources to be reserved


def lost_trainer_nodes(actor: RayWorkerGroup) -> list[LostNode]:
    """The nodes Ray declared dead that held actor ranks, whichever group's call noticed the loss (none when
    only the separate engines' node went)."""
    return find_lost_nodes(actor.node_info)


def pool_nodes_of(lost: list[LostNode], cfg: DictConfig) -> int:
    """How many of the trainer's pool nodes (`trainer.n_gpus_per_node` ranks each) the lost ranks made up."""
    return -(-sum(len(node.ranks) for node in lost) // int(cfg.trainer.n_gpus_per_node))


def config_on_nodes(cfg: DictConfig, nnodes: int) -> DictConfig:
    """`cfg` for `nnodes` pool nodes, resuming from the newest whole checkpoint of the run. Raises InputError
    (one line) when nothing is left, when the step's batch does not split over that many workers, or (a GPU run
    on fewer GPUs: bigger shards each) when the memory plan no longer fits."""
    if nnodes < 1:
        raise InputError(
            f"every node of the run's {cfg.trainer.nnodes} pool nodes (trainer.nnodes) is lost; nothing is left to "
            "continue on. The last whole checkpoint is kept: start the run again when nodes are back"
        )
    resized = copy.deepcopy(cfg)
    resized.trainer.nnodes = nnodes
    resized.trainer.resume_mode = "auto"
    kept = "The last whole checkpoint is kept: resume it with settings that fit the nodes left"
    problems = batch_split_problems(resized)
    if problems:
        raise InputError(f"cannot go on with trainer.nnodes={nnodes}: " + "; and ".join(problems) + f". {kept}")
    if nnodes < cfg.trainer.nnodes:
        try:
            check_memory(resized)
        except InputError as error:
            raise InputError(f"cannot go on with trainer.nnodes={nnodes}: {error}. {kept}") from None
    return resized


def free_pool_nodes(cfg: DictConfig, wanted: int) -> int:
    """How many more pool nodes (`n_gpus_per_node` processes of `gpus_per_process` GPUs or one CPU each) the
    cluster can place now, up to `wanted`: each is reserved for a moment as the run would reserve it (a placement
    group packed on one node), which counts what other jobs hold, then given back."""
    per_node = int(cfg.trainer.n_gpus_per_node)
    bundle = {"CPU": 1.0}
    if use_gpu(cfg):
        bundle["GPU"] = float(cfg.trainer.get("gpus_per_process", 1))
    probes = []
    try:
        for _ in range(wanted):
            probe = placement_group([dict(bundle) for _ in range(per_node)], strategy="STRICT_PACK")
            probes.append(probe)
            ready, _ = ray.wait([probe.ready()], timeout=FREE_NODE_PROBE_S)
            if not ready:
                return len(probes) - 1
        return len(probes)
    finally:
        for probe in probes:
            remove_placement_group(probe)


class NodeChanges:
    """The launcher's side of trainer.on_node_loss / on_node_join: the run's current config (its `nnodes`
    changes), and the rebuild of the worker groups and the tracker after a loss or a join."""

    def __init__(self, cfg: DictConfig, data: RunData, build_roles: Callable[[DictConfig], Any], open_tracker: Any):
        self.cfg = cfg
        self.policy = NodePolicy.from_config(cfg)
        self.data, self.build_roles, self.open_tracker = data, build_roles, open_tracker
        # Where the run started: with no checkpoint yet, a loss starts the prompts over from here.
        self.first_loader_state = data.train_loader.state_dict()
        self.joined = 0  # pool nodes found free by the last join check

    @property
    def nnodes(self) -> int:
        return int(self.cfg.trainer.nnodes)

    def join_check(self) -> Callable[[], bool] | None:
        """What the loop asks after each checkpoint (None when the run cannot grow): is a node free to take?"""
        if not self.policy.grow_on_join or self.nnodes >= self.policy.full_nnodes:
            return None
        return self._nodes_joined

    def _nodes_joined(self) -> bool:
        # One probe for as many nodes as the run lacks: after_join grows by the count found here.
        self.joined = free_pool_nodes(self.cfg, self.policy.full_nnodes - self.nnodes)
        return self.joined > 0

    def after_loss(self, error: NodeLostError, roles: Any, tracker: Tracker) -> tuple[Any, Tracker]:
        """Report the loss, then the worker groups on the nodes left, from the newest whole checkpoint."""
        lost = lost_trainer_nodes(roles.actor)
        described = "; ".join(node.describe() for node in lost) or f"nodes {sorted(error.lost_nodes)} were lost"
        print(
            f"node loss (trainer.on_node_loss=continue), noticed in {error.group}.{error.method}: {described}",
            file=sys.stderr, flush=True,
        )
        smaller = config_on_nodes(self.cfg, self.nnodes - pool_nodes_of(lost, self.cfg))  # InputError: a clean stop
        print(
            f"continuing on {smaller.trainer.nnodes} of {self.policy.full_nnodes} nodes (trainer.nnodes) from "
            f"{self._resume_point(smaller)}",
            file=sys.stderr, flush=True,
        )
        return self._rebuild(smaller, roles, tracker)

    def after_join(self, roles: Any, tracker: Tracker) -> tuple[Any, Tracker]:
        """The worker groups on the nodes the run had plus those that joined, from the checkpoint just saved."""
        more = self.nnodes + self.joined
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
        """The groups on `cfg`'s nodes, then the tracker reopened at the checkpoint's step. A failing build
        leaves the run's tracker open for the launcher to close (the old groups are already released)."""
        roles.shutdown()
        step = resume_step(cfg) or 0
        if step == 0:  # nothing to resume: the new loop starts on the run's first prompts again
            self.data.train_loader.load_state_dict(self.first_loader_state)
        rebuilt = self.build_roles(cfg)
        # The steps past the checkpoint are trained again: every backend drops what it logged of them.
        kept = [record for record in tracker.history if record["step"] <= step]
        tracker.close()
        try:
            tracker = self.open_tracker(step)
        except BaseException:
            rebuilt.shutdown()  # the launcher releases the groups it knows of: the old ones
            raise
        tracker.history = kept
        tracker.set_counts(self.data.prompt_counts)
        self.cfg = cfg
        return rebuilt, tracker
