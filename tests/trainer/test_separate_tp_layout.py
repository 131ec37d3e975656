"""The layout of vLLM's RLHF example through the config (the issue "[Side by side at 7B]", item 5): the trainer
on one GPU, one vLLM engine of tensor parallel 2 on two more, weights by NCCL broadcast, each sync verified.
CPU checks of the config path only: the config and worker checks accept it, the memory plan has a trainer GPU
and two engine GPUs, the GPU count and the sync path follow."""

from __future__ import annotations

import pytest

from benchmarks.model_shapes import QWEN2_0_5B
from benchmarks.random_model import write_config
from single_controller.worker import NodeInfo
from trainer.batch_checks import batch_split_problems
from trainer.config_loader import load_config
from trainer.memory_plan import GIB, build_plan
from trainer.perf_metrics import GpuCounts
from trainer.preflight import check_worker_settings
from trainer.role_groups import actor_worker_config, engine_decode_batch
from workers.rollout.sync_path import NCCL, choose_sync_path

LAYOUT = ["trainer.n_gpus_per_node=1", "trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm",
          "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
          "actor_rollout_ref.rollout.verify_sync=true", "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
          "data.max_prompt_length=512", "data.max_response_length=1024", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    model = tmp_path_factory.mktemp("qwen2_0_5b")
    write_config(model, QWEN2_0_5B)  # 14 heads, 2 key/value heads: tensor parallel 2 splits them
    return load_config([f"actor_rollout_ref.model.path={model}", *LAYOUT])


def test_checks_accept_it(cfg):
    check_worker_settings(cfg)  # the workers' own config checks, as before Ray starts
    assert batch_split_problems(cfg) == []
    rollout = actor_worker_config(cfg)["rollout"]
    assert (rollout["tensor_model_parallel_size"], rollout["verify_sync"], rollout["max_model_len"]) == (2, True, 1536)
    assert engine_decode_batch(cfg) == 256  # the one engine decodes every response of the step


def test_memory_plan_has_one_trainer_gpu_and_two_engine_gpus(cfg):
    plan = build_plan(cfg, int(79.6 * GIB))  # H100s
    groups = {group.name: group for group in plan.groups}
    assert groups["trainer GPUs"].gpus == 1 and groups["rollout GPUs"].gpus == 2
    engine = groups["rollout GPUs"].rows[0]
    assert engine.parts["engine"] == int(cfg.actor_rollout_ref.rollout.gpu_memory_utilization * 79.6 * GIB)
    assert all(row.parts.get("engine", 0) == 0 for row in groups["trainer GPUs"].rows)  # no engine on GPU 0
    assert plan.fits() is True


def test_gpus_and_sync_path(cfg):
    counts = GpuCounts.from_config(cfg)
    assert (counts.trainer, counts.rollout, counts.total) == (1, 2, 3)
    trainer = [NodeInfo(0, "node", "127.0.0.1", 1, ("0",))]
    engine = [NodeInfo(0, "node", "127.0.0.1", 2, ("1", "2"))]
    assert choose_sync_path(trainer, engine, use_gpu=True, infer_tp=2).kind == NCCL
    with pytest.raises(ValueError, match="NCCL needs every engine off train rank 0's GPU"):
        choose_sync_path(trainer, [NodeInfo(0, "node", "127.0.0.1", 2, ("0", "1"))], use_gpu=True, infer_tp=2)


def test_heads_tensor_parallel_cannot_split(tmp_path):
    write_config(tmp_path, QWEN2_0_5B)
    odd = load_config([f"actor_rollout_ref.model.path={tmp_path}", *LAYOUT, "actor_rollout_ref.rollout.tensor_model_parallel_size=4"])
    assert any("cannot split the model's 14 attention heads" in p for p in batch_split_problems(odd))
