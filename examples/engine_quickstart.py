"""The engine API end to end on the tiny model: generate, free the engine, train, sync, generate again.

    python -m examples.engine_quickstart [--model outputs/tiny_model]

`TinyPolicy` is the whole algorithm side: a Qwen2 model plus the methods the driver calls on it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, Qwen2ForCausalLM

from workers.engines import InferenceEngine, NeedParallel, TrainEngine, TrainModule


class TinyPolicy(TrainModule, Qwen2ForCausalLM):
    """Supervised steps towards given responses (a stand-in for any policy-gradient loss)."""

    def on_weights_materialized(self) -> None:
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_step(self, sequences: list[list[int]], scale: float) -> float:
        ids = torch.tensor(sequences, device=next(self.parameters()).device)
        loss = scale * self(input_ids=ids, labels=ids).loss  # self(...) under FSDP2 gathers the shards
        loss.backward()
        return float(loss)

    def optimizer_step(self) -> float:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)


def run(model_path: str, steps: int = 5, colocate: bool = True) -> dict[str, object]:
    """`colocate`: the train engine on the inference engine's devices (the default), else on its own."""
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 18, 19, 20]]
    greedy = {"temperature": 0.0, "max_tokens": 8}
    infer = InferenceEngine(model_path, executor="vllm").build(tensor_parallel_size=1)
    before = [r["token_ids"] for part in infer.generate(NeedParallel(prompts), greedy) for r in part]
    infer.meta()  # the trainer gets the memory
    with init_empty_weights():
        policy = TinyPolicy(AutoConfig.from_pretrained(model_path))  # meta device: ships as a few KB
    train = TrainEngine(policy).build(colocate_with=infer if colocate else None)
    target = [p + [40, 41, 42, 43, 44, 45, 46, 47] for p in prompts]
    losses = []
    for _ in range(steps):
        losses.append(train.train_step(NeedParallel(target), 1.0)[0])
        train.optimizer_step()
    infer.cuda()
    sync = train.p2p_weight_sync(infer)
    after = [r["token_ids"] for part in infer.generate(NeedParallel(prompts), greedy) for r in part]
    return {"before": before, "after": after, "losses": losses, "sync": sync, "train": train, "infer": infer}


def run_example(description: str, default_model: str, build: Callable[[Path], Any], run_fn: Callable[[str], dict]) -> None:
    """The engine examples' command line: build the model folder if missing, start a local cluster, run,
    print the losses (and the sync and greedy outputs when there is an inference engine), shut down."""
    from single_controller.ray.local_cluster import init_local_ray, prepend_pythonpath

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=default_model)
    args = parser.parse_args()
    if not Path(args.model).is_dir():
        build(Path(args.model))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    init_local_ray(num_cpus=4, runtime_env={"env_vars": {"PYTHONPATH": prepend_pythonpath(os.getcwd())}})
    result = run_fn(args.model)
    print("losses:", [round(x, 3) for x in result["losses"]])
    if "infer" in result:
        print("sync path:", result["train"].sync_path)
        print("sync:", result["sync"])
        print("greedy before:", result["before"][0], "after:", result["after"][0])
        result["infer"].shutdown()
    result["train"].shutdown()


def main() -> None:
    from trainer.tiny_model import build_tiny_model

    run_example(__doc__, "outputs/tiny_model", build_tiny_model, run)


if __name__ == "__main__":
    main()
