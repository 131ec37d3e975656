"""`FSDPCriticSide`: the critic worker's FSDP2 value model (HF token classification, one label), laid out
(`ulysses_sequence_parallel_size`) and offloaded (`model.fsdp_config`) as the actor's (`FSDPSide`)."""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForTokenClassification

from workers.config import mini_batch_per_rank
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.offload import Offloader
from workers.fsdp.residency import CRITIC, Residency, process_tenants
from workers.fsdp.side import FSDPSide
from workers.fsdp.ulysses import init_sequence_layout


class FSDPCriticSide(FSDPSide):
    host_buffers_metric = "offload/critic_host_buffers_gib"

    def __init__(self, worker: Any) -> None:
        cfg = worker.config
        setting = "critic.ulysses_sequence_parallel_size"
        self.layout = init_sequence_layout(worker, cfg["ulysses_sequence_parallel_size"], setting)
        mini_batch_per_rank(cfg, cfg["rollout_n"], self.layout.dp_size, self.layout.where("critic"))
        # num_labels=1: one value per token. The head is new (seeded, so equal on all ranks); no dropout
        # on it, or values in training would not match the values the advantages were computed from.
        self.critic = FSDPBackend(
            AutoModelForTokenClassification,
            cfg["model"],
            worker.rank,
            optim_cfg=cfg["optim"],
            config_overrides={"num_labels": 1, "classifier_dropout": 0.0},
            seed=cfg["seed"],
            sequence_parallel=self.layout.group,
            sequence_parallel_setting=setting,
            shard_size=cfg["model"]["fsdp_config"]["fsdp_size"],
        )
        offload, critic = cfg["model"]["fsdp_config"], self.critic
        offloader = Offloader(
            critic.module, critic.optimizer, critic.device, offload["param_offload"], offload["optimizer_offload"]
        )
        self.residency = Residency(CRITIC, offloader, process_tenants())
        self.residency.offload()  # until the critic first computes

    def export_hf(self, path: str) -> None:
        """An HF token-classification folder (rank 0 writes)."""
        self.critic.export_hf(path)
