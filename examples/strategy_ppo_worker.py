"""`StrategyPPOWorker`: a PPO actor written by hand with the strategy API (its own model, loss, optimizer).

Per step the driver calls `generate` (the engine samples; it then sleeps so training has the memory) and
`ppo_train` (load the optimizer, train, offload the optimizer, wake the engine, update its weights).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM

from single_controller import Dispatch, Worker, register
from workers.memory import MemoryLog
from workers.strategy import get_strategy


def right_padded(sequences: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, sequences))
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    return ids, mask


def response_positions(prompt_lengths: list[int], response_lengths: list[int], width: int) -> torch.Tensor:
    """[B, width - 1] 1 where the shifted log-prob column scores a response token."""
    mask = torch.zeros(len(prompt_lengths), width - 1)
    for row, (start, length) in enumerate(zip(prompt_lengths, response_lengths)):
        mask[row, start - 1 : start - 1 + length] = 1
    return mask


class StrategyPPOWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        self.strategy = get_strategy(cfg["strategy"])
        model = AutoModelForCausalLM.from_pretrained(cfg["model_path"], dtype=torch.float32)
        self.pad_token_id = model.config.pad_token_id or 0
        if self.strategy.backend == "megatron":
            optimizer = {"lr": cfg["lr"]}  # Megatron builds its own optimizer from settings
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
        self.actor, self.optimizer, self.scheduler = self.strategy.prepare(model, optimizer, None)
        self.strategy.setup_inference_engine({"model_path": cfg["model_path"], **cfg["inference"]}, cfg["engine_type"])
        self.strategy.maybe_offload_optimizer(self.optimizer)  # only the update needs it
        self.memory = MemoryLog(self.strategy.device)  # GPU: whole-device use after each phase

    @register(Dispatch.SPLIT_JOIN)
    def generate(self, prompts: list[list[int]], sampling: dict[str, Any]) -> list[dict[str, list]]:
        results = self.strategy.gather_and_generate(prompts, sampling)
        self.memory.record("generate")
        self.strategy.maybe_sleep_inference_engine()  # training gets the memory
        self.memory.record("engine_asleep")
        return results

    @register(Dispatch.SPLIT_JOIN)
    def ppo_train(self, experience: list[dict[str, Any]]) -> list[dict[str, float]]:
        """Rows {"prompt", "response", "old_log_probs", "advantage"}; one clipped-surrogate step per
        micro-batch, then the new weights go to the engine."""
        strategy, cfg = self.strategy, self.config
        strategy.maybe_load_optimizer(self.optimizer)
        losses, norms = [], []
        micro = cfg["micro_batch_size"]
        for start in range(0, len(experience), micro):
            rows = experience[start : start + micro]
            ids, mask = right_padded([r["prompt"] + r["response"] for r in rows], self.pad_token_id)
            scored = response_positions([len(r["prompt"]) for r in rows], [len(r["response"]) for r in rows], ids.shape[1])
            old = torch.zeros_like(scored)
            for row, r in enumerate(rows):
                begin = len(r["prompt"]) - 1
                old[row, begin : begin + len(r["response"])] = torch.tensor(r["old_log_probs"])
            advantages = torch.tensor([r["advantage"] for r in rows])[:, None]
            log_probs = strategy.sequence_log_probs(self.actor, ids, mask).cpu()
            ratio = torch.exp(log_probs - old)
            clipped = torch.clamp(ratio, 1 - cfg["clip_ratio"], 1 + cfg["clip_ratio"])
            surrogate = -torch.minimum(ratio * advantages, clipped * advantages)
            loss = (surrogate * scored).sum() / scored.sum().clamp(min=1)
            strategy.backward(loss, self.actor, self.optimizer)
            norms.append(strategy.optimizer_step(self.optimizer, self.actor, self.scheduler, name="actor"))
            losses.append(loss.item())
        self.memory.record("train")
        strategy.maybe_offload_optimizer(self.optimizer)
        self.memory.record("optimizer_offloaded")
        strategy.wakeup_inference_engine()
        sync = strategy.update_engine_weights(self.actor)
        self.memory.record("engine_updated")
        # A mixture of experts with router_aux_loss_coef: the routers' load-balancing loss rode along in the backward.
        routers = strategy.router_losses(self.actor) if cfg["strategy"].get("router_aux_loss_coef") is not None else {}
        metrics = strategy.all_reduce({"actor/loss": sum(losses) / len(losses), "actor/grad_norm": sum(norms) / len(norms),
                                       **{f"actor/{k}": v for k, v in routers.items()}, **sync, **self.memory.pop()})
        return [metrics] if self.rank == 0 else []  # joined in rank order: one entry
