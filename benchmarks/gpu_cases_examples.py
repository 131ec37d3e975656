"""The GPU suite's cases that run the examples a user starts from (the engine API's, the strategy API's PPO loop)
rather than `python -m trainer.main`: each runs alone, since its in-process vLLM engine sizes its cache from the
GPU's free memory."""

from __future__ import annotations

from benchmarks.suite_runner import Case, ExampleCheck, HistoryCheck


def example_cases_one_gpu() -> list[Case]:
    return [
        Case(
            "engine_examples",
            "one",
            "the engine-API examples: quick start, LoRA, VLM (colocated, CUDA IPC)",
            (("-m", "benchmarks.engine_examples", "--workdir", ".", "--out", "examples.json"),),
            ExampleCheck(("quickstart (colocated)", "lora (colocated)", "vlm")),
            alone=True,
        ),
        *(
            Case(
                f"strategy_ppo_{backend}",
                "one",
                f"the strategy API's PPO example (a user's own worker and loop) on {backend}, its in-process vLLM "
                "engine measuring its share of the GPU, every engine update verified",
                (("-m", "examples.strategy_ppo", "--engine", "vllm", "--backend", backend, "--steps", "12",
                  "--model", "tiny_model", "--history-json", "history.json"),),
                HistoryCheck(12, reward_rises_by=0.3),
                alone=True,
            )
            for backend in ("fsdp2", "megatron")
        ),
        Case(
            "strategy_ppo_moe",
            "one",
            "the strategy API's PPO example on the tiny mixture of experts (FSDP2), its routers' load-balancing loss "
            "in the user's backward, the vLLM engine's fused-MoE kernels, every engine update verified",
            (("-m", "examples.strategy_ppo", "--engine", "vllm", "--moe", "--model", "tiny_moe",
              "--router-aux-loss-coef", "0.001", "--steps", "16", "--history-json", "history.json"),),
            HistoryCheck(16, reward_rises_by=0.3, finite=("actor/loss", "actor/router_aux_loss")),
            alone=True,
        ),
    ]


def example_cases_two_gpus() -> list[Case]:
    return [
        Case(
            "engine_quickstart_two_gpus",
            "two",
            "engine-API quick start, train engine colocated and on its own GPU (NCCL)",
            (("-m", "benchmarks.engine_examples", "--only", "quickstart", "--workdir", ".", "--out", "examples.json"),),
            ExampleCheck(("quickstart (colocated)", "quickstart (own GPU)")),
            alone=True,
        ),
    ]
