"""Online DPO as a plain driver loop over three worker groups: the tutorial's sketch, made real.

    python -m examples.online_dpo_sketch

A sample generator draws several responses per prompt, a rule scores them, best and worst form a pair,
a frozen reference policy gives their log-probs, and a two-worker data-parallel DPO actor (gloo all-reduce)
is updated; its weights then go back to the generator. The DPO loss goes down and the score goes up.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from examples.tiny_policy import NUM_PROMPTS, TinyPolicy, score  # noqa: E402
from protocol import DataProto  # noqa: E402
from single_controller import Dispatch, Worker, register  # noqa: E402
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from single_controller.ray.local_cluster import init_local_ray  # noqa: E402


def dispatch_data(worker_group, data):
    """Custom dispatch, as the tutorial writes it: one chunk of prompts per worker."""
    return data.chunk(worker_group.world_size)


def collect_data(worker_group, data):
    return DataProto.concat(data)


class SampleGenerator(Worker):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.policy = TinyPolicy(seed=config["seed"])

    @register(dispatch_mode={"dispatch_fn": dispatch_data, "collect_fn": collect_data})
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """n samples per prompt (all on this worker, so a prompt's group stays together); seed per step and rank."""
        prompts = prompts.repeat(prompts.meta_info["samples_per_prompt"], interleave=True)
        generator = torch.Generator().manual_seed(prompts.meta_info["step"] * 1000 + self.rank)
        responses = self.policy.sample(prompts.batch["prompt"], generator)
        return prompts.union(DataProto.from_dict({"response": responses}))

    @register(Dispatch.ONE_TO_ALL)
    def set_weights(self, state: dict) -> None:
        self.policy.load_state_dict(state)


class ReferencePolicy(Worker):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.policy = TinyPolicy(seed=seed)

    @register(Dispatch.DP_COMPUTE_PROTO)
    @torch.no_grad()
    def infer(self, pairs: DataProto) -> torch.Tensor:
        """[B, 2]: reference log-probs of the chosen and the rejected response."""
        p = pairs.batch["prompt"]
        return torch.stack([self.policy.log_prob(p, pairs.batch["chosen"]), self.policy.log_prob(p, pairs.batch["rejected"])], -1)


class DPOActor(Worker):
    def __init__(self, seed: int = 0, beta: float = 0.5, lr: float = 0.3) -> None:
        super().__init__()
        self.policy, self.beta = TinyPolicy(seed=seed), beta
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=lr)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def update(self, pairs: DataProto) -> DataProto:
        self.init_process_group(backend="gloo")  # no-op after the first call
        p = pairs.batch["prompt"]
        chosen, rejected = self.policy.log_prob(p, pairs.batch["chosen"]), self.policy.log_prob(p, pairs.batch["rejected"])
        ref = pairs.batch["ref_log_prob"]
        margin = self.beta * ((chosen - ref[:, 0]) - (rejected - ref[:, 1]))
        losses = -F.logsigmoid(margin)
        self.optimizer.zero_grad()
        losses.mean().backward()
        for param in self.policy.parameters():  # data parallel: average gradients over the group
            torch.distributed.all_reduce(param.grad, op=torch.distributed.ReduceOp.AVG)
        self.optimizer.step()
        return DataProto.from_dict({"dpo_loss": losses.detach(), "reward_margin": margin.detach() / self.beta})

    @register(Dispatch.RANK_ZERO)
    def get_weights(self) -> dict:
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}


def generate_scores(data: DataProto) -> DataProto:
    return data.union(DataProto.from_dict({"score": score(data.batch["prompt"], data.batch["response"])}))


def generate_pairwise_data(data: DataProto) -> DataProto:
    """Best vs worst response per prompt; prompts whose responses all score the same give no pair."""
    rows = []
    for uid in dict.fromkeys(data.non_tensor_batch["uid"]):
        group = np.flatnonzero(data.non_tensor_batch["uid"] == uid)
        scores = data.batch["score"][group]
        if scores.max() > scores.min():
            rows.append((group[int(scores.argmax())], group[int(scores.argmin())]))
    best, worst = [b for b, _ in rows], [w for _, w in rows]
    return DataProto.from_dict(
        {"prompt": data.batch["prompt"][best], "chosen": data.batch["response"][best], "rejected": data.batch["response"][worst]}
    )


def dataloader(steps: int, batch_size: int, samples_per_prompt: int):
    rng = np.random.default_rng(0)
    for step in range(steps):
        prompts = torch.as_tensor(rng.integers(0, NUM_PROMPTS, batch_size))
        uids = np.array([f"{step}-{i}" for i in range(batch_size)], dtype=object)
        yield DataProto.from_dict(
            {"prompt": prompts}, {"uid": uids}, meta_info={"step": step, "samples_per_prompt": samples_per_prompt}
        )


@ray.remote(num_cpus=1)
def main_task(config: dict) -> list[dict]:
    resource_pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    sample_gen = RayWorkerGroup(resource_pool, RayClassWithInitArgs(SampleGenerator, config=config))
    ref_policy = RayWorkerGroup(resource_pool, RayClassWithInitArgs(ReferencePolicy))
    dpo_policy = RayWorkerGroup(resource_pool, RayClassWithInitArgs(DPOActor))
    history = []
    for data in dataloader(config["steps"], config["batch_size"], config["samples_per_prompt"]):
        data = sample_gen.generate_sequences(data)
        data = generate_scores(data)
        mean_score = float(data.batch["score"].mean())
        data = generate_pairwise_data(data)
        data.batch["ref_log_prob"] = ref_policy.infer(data)
        metrics = dpo_policy.update(data)
        sample_gen.set_weights(dpo_policy.get_weights())  # the generator samples with the new policy
        history.append({"score": mean_score, "pairs": len(data), "dpo_loss": float(metrics.batch["dpo_loss"].mean())})
        print(f"step {len(history):2d}  score {mean_score:.3f}  pairs {len(data):2d}  dpo_loss {history[-1]['dpo_loss']:.4f}")
    return history


def main() -> None:
    init_local_ray(num_cpus=4)
    config = {"seed": 0, "steps": 30, "batch_size": 16, "samples_per_prompt": 4}
    history = ray.get(main_task.remote(config))
    first, last = history[:5], history[-5:]
    loss_before, loss_after = np.mean([h["dpo_loss"] for h in first]), np.mean([h["dpo_loss"] for h in last])
    score_before, score_after = np.mean([h["score"] for h in first]), np.mean([h["score"] for h in last])
    print(f"dpo_loss {loss_before:.4f} -> {loss_after:.4f}; score {score_before:.3f} -> {score_after:.3f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
