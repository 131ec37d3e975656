"""`MegatronCriticSide`: the critic worker's megatron-core value model, a GPT with a value head over TP x PP x DP
(workers/critic/worker.py). Its state may leave the device between its phases (`critic.megatron.*_offload`)."""

from __future__ import annotations

from typing import Any

from workers.config import mini_batch_per_rank
from workers.fsdp.residency import CRITIC, Residency, process_tenants
from workers.megatron.backend import MegatronBackend
from workers.megatron.router_training import RouterTraining
from workers.megatron.side import MegatronSide, trained_offloader


class MegatronCriticSide(MegatronSide):
    host_buffers_metric = "offload/critic_host_buffers_gib"

    def __init__(self, worker: Any) -> None:
        cfg = worker.config
        settings = self.init_parallel(worker, cfg["megatron"])
        mini_batch_per_rank(cfg, cfg["rollout_n"], self.data_parallel_size, self.where("critic"))
        # The value head is new: seeded, so it starts equal on every rank.
        router = RouterTraining.from_config(cfg["megatron"]["override_transformer_config"])
        self.critic = MegatronBackend(
            cfg["model"], settings, cfg["optim"], value_head=True, seed=cfg["seed"], router=router
        )
        self.residency = Residency(CRITIC, trained_offloader(self.critic, cfg["megatron"]), process_tenants())
        self.residency.offload()  # as the FSDP critic: its state leaves at the end of its start

    def export_hf(self, path: str) -> None:
        raise NotImplementedError(
            "export_hf of a Megatron critic: the value head has no HF causal-LM form; use save_checkpoint "
            "(or critic.strategy=fsdp for an HF token-classification export)"
        )
