"""Multi-turn rollouts end to end: vLLM turns (log-probs over tool holes), GRPO steps on vLLM, and learning
the tool task with HF generate."""

import numpy as np
import pytest
import ray

from tests.e2e.conftest import run_overrides
from trainer.config_loader import load_config
from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.main import run

pytestmark = pytest.mark.slow

TASK = ("task=tool_vault", "trainer.val_before_train=false", "trainer.save_at_end=false")


@pytest.fixture(scope="module")
def vault_assets(tiny_assets, tmp_path_factory):
    train, val = write_synthetic_dataset(tmp_path_factory.mktemp("vault"), train_size=256, val_size=16, seed=0, tasks=("tool_vault",))
    return {**tiny_assets, "train": str(train), "val": str(val)}


@ray.remote(num_cpus=1)
def vllm_turns_against_hf(model_path: str) -> dict:
    """In a worker process (vLLM sets up torch.distributed in its host process)."""
    import torch
    from transformers import AutoModelForCausalLM

    from protocol import DataProto
    from tests.rollout.test_agent_loop import PAD, PARAMS, AlwaysCall, make_agent, prompt_batch
    from workers.config import actor_rollout_ref_config
    from workers.fsdp.sequences import response_log_probs_and_entropy
    from workers.rollout.agent.batch import conversation_batch
    from workers.rollout.agent.engines import VLLMTurns
    from workers.rollout.agent.loop import AgentLoop
    from workers.rollout.vllm_engine import VLLMEngine

    rollout = actor_rollout_ref_config({"model": {"path": model_path}, "rollout": {"max_model_len": 128, "cpu_kv_cache_mb": 64}})["rollout"]
    engine = VLLMEngine(model_path, rollout, torch.float32, torch.device("cpu"), seed=0)
    agent = make_agent(response_length=64, max_turns=3, max_tokens_per_turn=6)
    prompts = prompt_batch(4)
    loop = AgentLoop(VLLMTurns(engine.llm, PARAMS, call_seed=7, rank=0), AlwaysCall(), agent.bridge, agent.settings)
    contexts = [row[m.bool()].tolist() for row, m in zip(prompts["input_ids"], prompts["attention_mask"])]
    out = conversation_batch(prompts, loop.run(contexts, [agent.new_environment() for _ in range(4)]), 64, PAD)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        recomputed, _ = response_log_probs_and_entropy(model, DataProto.from_dict(out), torch.device("cpu"), 1.0, False)
    mask = out["response_mask"].bool()
    holes = (~mask) & out["attention_mask"][:, -64:].bool()
    return {"gap": float((recomputed - out["rollout_log_probs"]).abs()[mask].max()), "turns": out["num_turns"].tolist(),
            "rows_with_holes": int(holes.any(dim=1).sum()), "model_tokens": int(mask.sum())}


def test_vllm_turns_log_probs_match_the_trainers_on_model_tokens(ray_cluster, tiny_assets):
    result = ray.get(vllm_turns_against_hf.remote(tiny_assets["model"]))
    assert result["turns"] == [3] * 4 and result["rows_with_holes"] == 4 and result["model_tokens"] > 0
    assert result["gap"] < 1e-3, result


def test_multi_turn_grpo_steps_on_hybrid_vllm(ray_cluster, vault_assets, tmp_path):
    cfg = load_config(run_overrides(vault_assets, tmp_path, *TASK, "actor_rollout_ref.rollout.name=vllm",
                                    "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.test_freq=-1"))
    history = run(cfg)
    assert len(history) == 2
    for record in history:
        assert record["agent/turns_mean"] >= 1 and np.isfinite(record["actor/pg_loss"])
        assert record["rollout/logprob_gap_max"] < 1e-3, record  # engine vs trainer, on model tokens only


def test_tool_use_is_learned_on_the_tool_task(ray_cluster, vault_assets, tmp_path):
    """The random tiny model rarely calls the tool; GRPO makes calling the rule within ~15 steps (the full
    learning run, to the right answers, is benchmarks/learning_agent.py)."""
    cfg = load_config(run_overrides(vault_assets, tmp_path, *TASK, "trainer.total_training_steps=20", "trainer.test_freq=-1"))
    history = run(cfg)
    use = [record["agent/tool_use_rate"] for record in history]
    assert use[0] < 0.1 and np.mean(use[-3:]) > 0.7, use
    assert np.mean([r["reward/mean"] for r in history[-3:]]) > np.mean([r["reward/mean"] for r in history[:2]]) + 0.1
