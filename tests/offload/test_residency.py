"""The placement policy: the actor's parameters leave the GPU only when another tenant claims it, the
optimizer state is on the device only inside steps, the reference comes and goes around its log-probs."""

from __future__ import annotations

import pytest
import torch

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.model_folders import write_random_qwen2
from tests.offload.tiny import UNEVEN, device_bytes, identical, sharded_model, snapshot, train_step
from tests.workers.conftest import TINY_CONFIG
from tests.workers.helpers import actor_config, random_prompts
from workers.fsdp import ActorRolloutRefWorker
from workers.fsdp.offload import Offloader
from workers.fsdp.residency import ACTOR, CRITIC, DeviceTenants, Residency
from workers.training.dist_utils import single_process_group

CPU = torch.device("cpu")
OFFLOAD_ALL = {"actor": {"fsdp_config": {"param_offload": True, "optimizer_offload": True}, "use_kl_loss": True},
               "ref": {"fsdp_config": {"param_offload": True}}}


@pytest.fixture(scope="module")
def process_group():
    with single_process_group(CPU):
        yield


def test_tenants_release_every_other_tenant_on_a_claim():
    tenants, released = DeviceTenants(), []
    tenants.register("actor", lambda: released.append("actor"))
    tenants.register("critic", lambda: released.append("critic"))
    tenants.claim("actor")
    tenants.claim("rollout")
    assert released == ["critic", "actor", "critic"] and tenants.claims == ["actor", "rollout"]


def test_a_hybrid_step_moves_the_actor_out_for_generation_only(process_group):
    """The worker's calls of one GRPO step with a hybrid engine, with real moves on CPU host buffers."""
    actor_model, optimizer = sharded_model(UNEVEN, seed=1)
    ref_model, _ = sharded_model(UNEVEN, seed=1)
    actor = Offloader(actor_model, optimizer, CPU, True, True, move_on_cpu=True)
    ref = Offloader(ref_model, None, CPU, True, False, frozen=True, move_on_cpu=True)
    tenants = DeviceTenants()
    policy = Residency(ACTOR, actor, tenants, ref)
    policy.offload()
    init = policy.end_phase("init")
    steps = []
    for step in range(2):
        metrics = {}
        policy.trained_needed()  # generate: before the engine's weight sync
        policy.rollout_needs_device()  # after it, the engine generates
        metrics["generate"] = policy.end_phase("generate")
        policy.trained_needed()
        metrics["old_log_prob"] = policy.end_phase("old_log_prob")
        policy.ref_needed()
        policy.ref_done()
        metrics["ref_log_prob"] = policy.end_phase("ref_log_prob")
        policy.trained_needed()
        train_step(actor_model, optimizer, seed=step)
        metrics["update_actor"] = policy.end_phase("update_actor")
        steps.append(metrics)

    def moves(phase_metrics: dict[str, float]) -> tuple[float, float, float]:
        return tuple(v for k, v in sorted(phase_metrics.items()) if k.endswith("_moves"))  # optimizer, params, ref

    assert moves(init) == (1, 1, 1)
    assert moves(steps[0]["generate"]) == (0, 2, 0)  # in for the first sync (offloaded at init), out after it
    steady = steps[1]
    assert moves(steady["generate"]) == (0, 1, 0)  # the update left it on the GPU: out after the sync only
    assert moves(steady["old_log_prob"]) == (0, 1, 0)
    assert moves(steady["ref_log_prob"]) == (0, 0, 2)
    assert moves(steady["update_actor"]) == (2, 0, 0)
    # bytes follow the moves; the frozen reference only comes in (its host copy stays valid)
    params = sum(p.to_local().untyped_storage().nbytes() for p in actor_model.parameters())
    gib = {(phase, way): m[f"offload/{phase}/{way}_gib"] * 2**30
           for phase, m in steady.items() for way in ("h2d", "d2h")}
    assert gib["generate", "d2h"] >= params and gib["generate", "h2d"] == 0
    assert gib["old_log_prob", "h2d"] == gib["generate", "d2h"] and gib["old_log_prob", "d2h"] == 0
    assert gib["ref_log_prob", "d2h"] == 0 < gib["ref_log_prob", "h2d"]
    assert gib["update_actor", "h2d"] == gib["update_actor", "d2h"] > 0
    assert actor.params_on_device and not actor.optimizer_on_device and not ref.params_on_device
    # a colocated critic about to compute claims the device: the actor's parameters leave
    tenants.claim(CRITIC)
    assert not actor.params_on_device and device_bytes(actor_model, optimizer) == 0


def test_a_colocated_critic_and_actor_send_each_other_out_and_keep_adam_state_for_the_steps(process_group):
    """critic.model.fsdp_config: the critic's PPO phases beside an offloading actor, real moves on CPU buffers."""
    actor_model, actor_optimizer = sharded_model(UNEVEN, seed=1)
    critic_model, critic_optimizer = sharded_model(UNEVEN, seed=2)
    expected_model, expected_optimizer = sharded_model(UNEVEN, seed=2)  # the same critic, never moved
    actor = Offloader(actor_model, actor_optimizer, CPU, True, True, move_on_cpu=True)
    critic = Offloader(critic_model, critic_optimizer, CPU, True, True, move_on_cpu=True)
    tenants = DeviceTenants()
    actor_policy, policy = Residency(ACTOR, actor, tenants), Residency(CRITIC, critic, tenants)
    policy.offload()
    assert policy.end_phase("critic_init")["offload/critic_init/critic_params_moves"] == 1
    assert device_bytes(critic_model, critic_optimizer) == 0
    for step in range(2):
        actor_policy.trained_needed()  # generation and the actor's log-probs: the critic stays out
        assert not critic.params_on_device
        policy.trained_needed()  # values: the actor's parameters leave, the critic's come
        assert critic.params_on_device and not actor.params_on_device
        values = policy.end_phase("values")
        policy.trained_needed()  # update: nothing moves, the Adam state comes for the step only
        loss = train_step(critic_model, critic_optimizer, seed=step)
        assert loss == train_step(expected_model, expected_optimizer, seed=step)
        update = policy.end_phase("update_critic")
        # in for the values; from the second step also out before them, when the actor's update claimed the GPU
        assert values["offload/values/critic_params_moves"] == (1 if step == 0 else 2)
        assert (values["offload/values/d2h_gib"] > 0) == (step > 0) and values["offload/values/h2d_gib"] > 0
        assert update["offload/update_critic/critic_params_moves"] == 0
        assert update["offload/update_critic/critic_optimizer_moves"] == 2  # in before the step, out after it
        assert critic.params_on_device and not critic.optimizer_on_device
        actor_policy.trained_needed()  # the actor's update claims the GPU
        assert not critic.params_on_device and device_bytes(critic_model, critic_optimizer) == 0
    critic.load(with_optimizer=True)  # back from the host: bit for bit the critic that never moved
    assert identical(snapshot(critic_model, critic_optimizer), snapshot(expected_model, expected_optimizer)) == []


@pytest.fixture(scope="module")
def worker(ray_cluster, tiny_model_dir):
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=False)
    config = actor_config(tiny_model_dir, **OFFLOAD_ALL)
    worker_class = RayClassWithInitArgs(ActorRolloutRefWorker, config, "actor_rollout_ref")
    group = RayWorkerGroup(pool, worker_class, call_timeout_s=180.0)
    group.init_model()
    yield group
    group.kill()
    pool.release()


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return write_random_qwen2(tmp_path_factory.mktemp("tiny_qwen2_offload"), TINY_CONFIG)


def _grpo_step(worker) -> dict[str, float]:
    rollout = worker.generate_sequences(random_prompts(4, [3, 5], seed=2))
    rollout = rollout.union(worker.compute_log_prob(rollout))
    rollout = rollout.union(worker.compute_ref_log_prob(rollout))
    rollout.batch["advantages"] = torch.linspace(-1, 1, len(rollout))[:, None] * rollout.batch["response_mask"].float()
    worker.update_actor(rollout)
    return worker.pop_step_metrics()[0]


def test_the_worker_keeps_the_actor_from_old_log_probs_to_the_update(worker):
    """HF rollout on CPU: nothing moves bytes there, but the requested moves are counted per phase."""
    first, second = _grpo_step(worker), _grpo_step(worker)
    assert first["offload/init/actor_params_moves"] == 1 and first["offload/init/ref_params_moves"] == 1
    assert first["offload/generate/actor_params_moves"] == 1  # back for the first generation (HF: the actor generates)
    assert second["offload/generate/actor_params_moves"] == 0  # no other tenant since: it stayed
    for metrics in (first, second):
        for phase in ("old_log_prob", "ref_log_prob", "update_actor"):
            assert metrics[f"offload/{phase}/actor_params_moves"] == 0, phase
        assert metrics["offload/ref_log_prob/ref_params_moves"] == 2
        assert metrics["offload/update_actor/actor_optimizer_moves"] == 2  # in for the step, out after it
        assert metrics["offload/update_actor/h2d_gib"] == 0 and metrics["offload/update_actor/d2h_gib"] == 0
