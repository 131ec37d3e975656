"""Where a vLLM engine's core runs (`rollout.engine_process`, null by default): in a process of its own for
separate engines whose weights arrive by broadcast, in the worker's where the trainer hands it tensors."""

from __future__ import annotations

import pytest

from benchmarks.model_shapes import QWEN2_0_5B
from benchmarks.random_model import write_config
from trainer.config_loader import load_config
from trainer.role_groups import actor_worker_config

SEPARATE = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2_0_5b")
    write_config(folder, QWEN2_0_5B)
    return folder


def engine_process(model, *overrides: str) -> bool:
    cfg = load_config([f"actor_rollout_ref.model.path={model}", *overrides])
    return actor_worker_config(cfg)["rollout"]["engine_process"]


@pytest.mark.parametrize(("overrides", "own"), [
    (("actor_rollout_ref.rollout.name=vllm",), False),  # hybrid: the engine inside the actor's process
    (SEPARATE, True),  # CPU: broadcast over gloo
    ((*SEPARATE, "trainer.device=cuda"), True),  # GPUs of its own: NCCL broadcast
    ((*SEPARATE, "trainer.device=cuda", "trainer.gpus_per_process=0.5", "actor_rollout_ref.rollout.gpus_per_engine=0.5"), False),  # CUDA IPC
    ((*SEPARATE, "actor_rollout_ref.rollout.engine_process=false"), False),  # asked for
])
def test_the_trainer_picks_where_the_engine_core_runs(model, overrides, own):
    assert engine_process(model, *overrides) is own
