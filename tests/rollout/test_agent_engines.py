"""Multi-turn rollouts end to end: vLLM turns (log-probs over tool holes), GRPO steps on vLLM, and learning
the tool task with HF generate."""

import numpy as np
import pytest
import ray

from tests.e2e.conftest import ONE_RANK, run_overrides
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
def vllm_turns(model_path: str) -> dict:
    """In a worker process (vLLM sets up torch.distributed in its host process): one engine, two checks."""
    import torch

    from workers.config import actor_rollout_ref_config
    from workers.rollout.vllm_engine import VLLMEngine

    rollout = actor_rollout_ref_config({"model": {"path": model_path}, "rollout": {"max_model_len": 384, "cpu_kv_cache_mb": 64}})["rollout"]
    engine = VLLMEngine(model_path, rollout, torch.float32, torch.device("cpu"), seed=0)
    return {"against_hf": turns_against_hf(engine, model_path), "scheduling": continuous_scheduling(engine)}


def turns_against_hf(engine, model_path: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from protocol import DataProto
    from tests.rollout.test_agent_loop import PAD, PARAMS, AlwaysCall, make_agent, prompt_batch
    from workers.fsdp.sequences import response_log_probs_and_entropy
    from workers.rollout.agent.batch import conversation_batch
    from workers.rollout.agent.engines import VLLMTurns
    from workers.rollout.agent.loop import AgentLoop

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


def continuous_scheduling(engine) -> dict:
    """Scripted tool calls over the real engine: row 0's first tool sleeps 4 s (long enough for the other rows
    to finish their turns on a loaded 2-core machine), row r's others 0.03 r s."""
    from tests.rollout.test_agent_loop import EOS, PARAMS, TOKENIZER, call, make_agent, prompt_batch, tools
    from workers.rollout.agent.engines import VLLMTurns
    from workers.rollout.agent.loop import AgentLoop
    from workers.rollout.agent.scripted import ScriptedStream

    def script(request):
        if request.turn == 2:
            return "done"
        return call("slow", seconds=4.0 if request.row == request.turn == 0 else round(0.03 * request.row, 2))

    agent = make_agent(tools=tools("slow"), response_length=300, max_turns=3, max_tokens_per_turn=96)
    stream = ScriptedStream(TOKENIZER, EOS, script, VLLMTurns(engine.llm, PARAMS, call_seed=7, rank=0))
    prompts = prompt_batch(6)
    contexts = [row[m.bool()].tolist() for row, m in zip(prompts["input_ids"], prompts["attention_mask"])]
    conversations = AgentLoop(stream, agent.parser, agent.bridge, agent.settings).run(contexts, [agent.new_environment() for _ in range(6)])
    when = {(r.row, r.turn): t for t, r, _ in stream.submissions}
    return {
        "turns": [c.turns for c in conversations], "tool_calls": [c.tool_calls for c in conversations],
        "slow_row_back": when[(0, 1)], "others_done": max(t for (row, turn), t in when.items() if row > 0 and turn == 2),
        "joined_running_batch": sum(1 for _, r, in_flight in stream.submissions if r.turn > 0 and in_flight > 0),
        "left_in_engine": stream.in_flight(),
    }


@pytest.fixture(scope="module")
def vllm_results(ray_cluster, tiny_assets):
    return ray.get(vllm_turns.remote(tiny_assets["model"]))


def test_vllm_turns_log_probs_match_the_trainers_on_model_tokens(vllm_results):
    result = vllm_results["against_hf"]
    assert result["turns"] == [3] * 4 and result["rows_with_holes"] == 4 and result["model_tokens"] > 0
    assert result["gap"] < 1e-3, result


def test_vllm_turns_join_the_running_batch_and_a_slow_tool_stalls_only_its_conversation(vllm_results):
    result = vllm_results["scheduling"]
    assert result["turns"] == [3] * 6 and result["tool_calls"] == [2] * 6 and result["left_in_engine"] == 0, result
    assert result["others_done"] < result["slow_row_back"], result  # the others finished all turns meanwhile
    assert result["joined_running_batch"] >= 1, result  # a turn entered while others were generating


@pytest.mark.parametrize("placement", ["hybrid", "separate"])
def test_multi_turn_grpo_steps_on_vllm(ray_cluster, vault_assets, tmp_path, placement):
    cfg = load_config(run_overrides(vault_assets, tmp_path, *TASK, "actor_rollout_ref.rollout.name=vllm",
                                    f"actor_rollout_ref.rollout.placement={placement}",
                                    # a separate engine's core in its worker's process (~16 s less on CPU): the turns
                                    # are the same; a core of its own is run by tests/rollout/test_vllm_rollout.py
                                    "actor_rollout_ref.rollout.engine_process=false",
                                    "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.test_freq=-1"))
    history = run(cfg)
    assert len(history) == 2
    for record in history:
        assert record["agent/turns_mean"] >= 1 and np.isfinite(record["actor/pg_loss"])
        assert record["rollout/logprob_gap_max"] < 1e-3, record  # engine vs trainer, on model tokens only


def test_tool_use_is_learned_on_the_tool_task(ray_cluster, vault_assets, tmp_path):
    """The random tiny model rarely calls the tool; GRPO makes calling the rule within ~15 steps (one rank, measured:
    the tool-use rate 0.91 at step 10, 0.97-0.98 over steps 13-15; the full learning run, to the right answers, is
    benchmarks/learning_agent.py)."""
    cfg = load_config(run_overrides(
        vault_assets, tmp_path, *TASK, ONE_RANK, "trainer.total_training_steps=15", "trainer.test_freq=-1"
    ))
    history = run(cfg)
    use = [record["agent/tool_use_rate"] for record in history]
    assert use[0] < 0.1 and np.mean(use[-3:]) > 0.7, use
    assert np.mean([r["reward/mean"] for r in history[-3:]]) > np.mean([r["reward/mean"] for r in history[:2]]) + 0.1
