"""`actor.strategy=megatron` / `critic.strategy=megatron` in the unchanged PPO/GRPO and online-DPO loops
(real Ray, megatron-core on CPU over gloo): the first step matches the FSDP backend, pipeline parallel
runs, a resumed run reproduces a straight one, the critic and the DPO update run, and the tiny mixture of
experts trains with its experts split over two ranks (expert parallel) as the FSDP backend trains it."""

import numpy as np
import pytest

from tests.e2e.conftest import ONE_RANK, comparable_metrics, run_overrides
from trainer.batch_checks import batch_split_problems
from trainer.config_loader import load_config
from trainer.main import run
from trainer.tiny_moe import ACTIVE_EXPERTS, EXPERTS, build_tiny_moe

pytest.importorskip("megatron.core", reason="install the [megatron] extra")
pytestmark = pytest.mark.slow

QUIET = ("trainer.test_freq=-1", "trainer.val_before_train=false")
MEGATRON = "actor_rollout_ref.actor.strategy=megatron"


def test_first_step_matches_the_fsdp_backend(ray_cluster, tiny_assets, tmp_path):
    """Same weights, seeds and rollouts: everything in step 1 (generation with the initial weights, advantages,
    log-probs, the losses, entropy and gradient norm) agrees with the FSDP backend. Two epochs over the one
    mini-batch, so the second sees ratios other than 1, with policy_loss.loss_mode=gspo: its sequence ratios are
    built from the same per-token log-probs and masks as the default loss's, which the MoE test below compares.
    One rank on each side: the data-parallel reduction over two is compared in the MoE test (its dense weights)."""
    common = (
        *QUIET, ONE_RANK, "trainer.total_training_steps=1", "trainer.save_at_end=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
    )
    fsdp = run(load_config(run_overrides(tiny_assets, tmp_path / "fsdp", *common)))
    megatron = run(load_config(run_overrides(tiny_assets, tmp_path / "mcore", *common, MEGATRON)))
    assert megatron[0]["actor/pg_clipfrac_lower"] == 0.0  # GSPO: no dual clip
    assert megatron[0]["actor/ppo_kl"] != 0.0  # the second epoch's ratios moved away from 1
    before_the_update = ("reward/mean", "response/length_mean", "advantage/mean")
    for key in before_the_update:
        assert megatron[0][key] == pytest.approx(fsdp[0][key], rel=1e-4, abs=1e-6), key
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac", "actor/grad_norm"):
        assert megatron[0][key] == pytest.approx(fsdp[0][key], rel=1e-3, abs=1e-6), key


def test_pipeline_parallel_resume_reproduces_a_straight_run(ray_cluster, tiny_assets, tmp_path):
    """With verl's Megatron offload switches on: on CPU nothing moves, but each move the policy asks for is counted
    (tests/megatron/test_megatron_offload.py moves them for real)."""
    offload = [f"actor_rollout_ref.actor.megatron.{key}=true" for key in ("param_offload", "grad_offload", "optimizer_offload")]
    common = (*QUIET, "trainer.save_freq=1", MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", *offload)
    straight = run(load_config(run_overrides(tiny_assets, tmp_path / "straight", "trainer.total_training_steps=2", *common)))
    moves = {k.removeprefix("offload/").removesuffix("_moves"): v for k, v in straight[1].items() if k.endswith("_moves")}
    # step 2: the HF replica's generation claims the GPU (weights and gradient buffers out); the old log-probs bring
    # the weights back, the reference comes and goes, the update brings the gradient buffers, and the optimizer's
    # state is in for each optimizer step and for the checkpoint only
    assert moves["generate/actor_params"] == moves["generate/actor_grads"] == 1
    assert moves["old_log_prob/actor_params"] == 1 and moves["ref_log_prob/ref_params"] == 2
    assert moves["update_actor/actor_grads"] == 1 and moves["update_actor/actor_params"] == 0
    assert moves["update_actor/actor_optimizer"] == 2 * 2  # the tiny job's 16 prompts in mini-batches of 8
    assert moves["save_checkpoint/actor_optimizer"] == 2
    # A run of its own resumes from the straight run's step-1 checkpoint (saved mid-run, as a run ending there would):
    # its step 2 starts from restored weights, Adam state, data position and random state.
    checkpoint = tmp_path / "straight" / "global_step_1"
    resumed = run(load_config(run_overrides(
        tiny_assets, tmp_path / "resumed", "trainer.total_training_steps=2", f"trainer.resume_mode={checkpoint}", *common,
    )))
    assert [r["step"] for r in resumed] == [2]
    assert comparable_metrics(resumed) == comparable_metrics(straight[1:])
    # verl's default distributed optimizer: besides each stage's model file, each rank's slices of the optimizer state.
    assert sorted(p.name for p in (checkpoint / "actor").iterdir()) == [
        "model_optim_tp0_pp0.pt", "model_optim_tp0_pp1.pt", "optimizer_tp0_pp0_rank0.pt", "optimizer_tp0_pp1_rank1.pt",
    ]


def test_tiny_moe_with_expert_parallel_matches_the_fsdp_backend_and_resumes(ray_cluster, tiny_assets, tmp_path):
    """trainer/tiny_moe.py (8 experts, 2 active) with actor.megatron.expert_model_parallel_size=2 (4 experts per
    rank): two GRPO steps agree with the FSDP backend (step 2's rollouts come from the weights step 1 trained,
    synced per expert into the HF rollout replica, which fuses the experts); each EP rank saves its own experts and
    their Adam state and reads them back, so a run resumed after step 1 reproduces the straight one."""
    assets = {**tiny_assets, "model": str(build_tiny_moe(tmp_path / "tiny_moe", seed=0))}
    common = (*QUIET, "actor_rollout_ref.actor.ppo_mini_batch_size=16")
    expert_parallel = (*common, "trainer.save_freq=1", MEGATRON, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2")
    fsdp = run(load_config(run_overrides(assets, tmp_path / "fsdp", *common, "trainer.total_training_steps=2",
                                         "trainer.save_at_end=false")))
    straight = run(load_config(run_overrides(assets, tmp_path / "straight", "trainer.total_training_steps=2", *expert_parallel)))
    keys = ("reward/mean", "response/length_mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm")
    assert len(straight) == len(fsdp) == 2
    for step in range(2):
        for key in keys:
            assert straight[step][key] == pytest.approx(fsdp[step][key], rel=1e-4, abs=1e-6), (step, key)
    assert straight[1]["actor/kl_loss"] > 0  # step 2 trains away from the reference: the weights moved

    checkpoint = tmp_path / "straight" / "global_step_1"
    resumed = run(load_config(run_overrides(
        assets, tmp_path / "resumed", "trainer.total_training_steps=2", f"trainer.resume_mode={checkpoint}", *expert_parallel,
    )))
    assert [r["step"] for r in resumed] == [2]
    assert comparable_metrics(resumed) == comparable_metrics(straight[1:])
    assert sorted(p.name for p in (checkpoint / "actor").iterdir()) == [
        "model_optim_tp0_pp0_ep0.pt", "model_optim_tp0_pp0_ep1.pt", "optimizer_tp0_pp0_rank0.pt", "optimizer_tp0_pp0_rank1.pt",
    ]


def test_ppo_with_megatron_critic_and_distributed_optimizer(ray_cluster, tiny_assets, tmp_path):
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, "algorithm=ppo", "trainer.total_training_steps=2", *QUIET, MEGATRON,
        "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true", "critic.strategy=megatron",
        "critic.megatron.use_distributed_optimizer=true", "trainer.export_hf_at_end=true",
        "critic.megatron.param_offload=true", "critic.megatron.grad_offload=true", "critic.megatron.optimizer_offload=true",
    ))
    history = run(cfg)
    assert len(history) == 2
    # The colocated critic's state leaves when the actor's process claims the GPU (counted on CPU, where nothing
    # moves; the critic reports the moves since its last phase): by step 2's values its weights and gradient
    # buffers left for the actor's update and generation, and its weights came back; its update brings the
    # gradient buffers, and its Adam state comes and goes for each optimizer step (two mini-batches).
    step_two = history[1]
    assert step_two["offload/values/critic_params_moves"] == 2
    assert step_two["offload/values/critic_grads_moves"] == 1
    assert step_two["offload/update_critic/critic_grads_moves"] == 1
    assert step_two["offload/update_critic/critic_params_moves"] == 0
    assert step_two["offload/update_critic/critic_optimizer_moves"] == 2 * 2
    for record in history:
        for key in ("critic/vf_loss", "critic/vpred_mean", "critic/grad_norm", "actor/pg_loss", "reward/mean"):
            assert np.isfinite(record[key]), (key, record)
    assert history[1]["critic/vpred_mean"] != history[0]["critic/vpred_mean"]  # the critic learned
    assert any((tmp_path / "global_step_2" / "critic").iterdir())
    # Saved by two data-parallel ranks, resumed by one (what trainer.on_node_loss=continue does on the node left):
    # each role's one rank reads its range of the optimizer state from both ranks' files.
    resumed = run(load_config(run_overrides(
        tiny_assets, tmp_path / "resumed", "algorithm=ppo", "trainer.total_training_steps=3", *QUIET, MEGATRON,
        ONE_RANK,
        "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true", "critic.strategy=megatron",
        "critic.megatron.use_distributed_optimizer=true", f"trainer.resume_mode={tmp_path / 'global_step_2'}",
        "trainer.save_at_end=false",
    )))
    assert [r["step"] for r in resumed] == [3]
    for key in ("critic/vf_loss", "critic/grad_norm", "actor/pg_loss", "actor/grad_norm"):
        assert np.isfinite(resumed[0][key]), key
    assert len(list((tmp_path / "global_step_2" / "critic").glob("optimizer_tp0_pp0_rank*.pt"))) == 2
    export = tmp_path / "hf_export"
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(export).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).state_dict()
    assert exported.keys() == initial.keys()
    assert any(not np.allclose(exported[k].numpy(), initial[k].numpy()) for k in initial)  # trained weights


def test_grpo_with_hybrid_vllm_fed_from_pipeline_stages(ray_cluster, tiny_assets, tmp_path):
    """Each of the 2 pipeline-stage ranks holds a vLLM engine; after every update the whole model is
    streamed into both (each stage's layers broadcast to the other) and the sync is verified. The actor's offload
    switches are on: on CPU nothing moves, each move the engine's claims ask for is counted. Token budgets
    (use_dynamic_bsz) fill each micro-batch with the padded rows that fit, in micro-batches of uneven rows."""
    from tests.rollout.conftest import SHORT_RUN
    from tests.rollout.test_vllm_rollout import VLLM, _check_verified_run, _param_count

    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, *VLLM, *SHORT_RUN, MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.param_offload=true", "actor_rollout_ref.actor.megatron.grad_offload=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=500",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=700",
    ))
    history = _check_verified_run(run(cfg), tiny_assets["model"])
    for record in history[1:]:
        assert record["rollout/sync_tensors"] == _param_count(tiny_assets["model"])
        # the engine's claim after its sync sends the weights and gradient buffers out; the old log-probs bring the
        # weights back, the update the gradient buffers; the reference follows the actor's switch
        assert record["offload/generate/actor_params_moves"] == record["offload/generate/actor_grads_moves"] == 1
        assert record["offload/old_log_prob/actor_params_moves"] == record["offload/update_actor/actor_grads_moves"] == 1
        assert record["offload/ref_log_prob/ref_params_moves"] == 2


def test_grpo_with_a_separate_vllm_engine_fed_from_pipeline_stages(ray_cluster, tiny_assets, tmp_path):
    """rollout.placement=separate: a vLLM engine in its own pool; the two pipeline stages stream the whole model
    (each stage's layers broadcast to the other) and rank 0 broadcasts it to the engine in buckets planned in the
    stream's order (small buckets: many of them); every sync is verified."""
    from tests.rollout.conftest import SHORT_RUN
    from tests.rollout.test_vllm_rollout import VLLM, _check_verified_run

    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, *VLLM, *SHORT_RUN, MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.weight_sync_bucket_mb=1",
    ))
    history = _check_verified_run(run(cfg), tiny_assets["model"])
    assert all(record["rollout/sync_gib"] > 0 for record in history[1:])


def test_grpo_with_hybrid_vllm_on_the_tiny_moe_with_folded_expert_parallel(ray_cluster, tiny_assets, tmp_path):
    """verl's "parallel folding": attention over TP 2 and whole experts over EP 2 (expert TP 1) on the same two
    ranks, each with a vLLM engine of the whole model; after every update each expert is broadcast from its EP rank
    into both engines under its checkpoint name, and the sync is verified. The routers train with verl's
    megatron-core load-balancing and z-losses (`+...override_transformer_config.*`, as verl's MoE scripts set them)
    beside its kernel switches, which change nothing here."""
    from safetensors import safe_open

    from tests.rollout.conftest import SHORT_RUN
    from tests.rollout.test_vllm_rollout import VLLM, _check_verified_run

    model = build_tiny_moe(tmp_path / "tiny_moe", seed=0, num_key_value_heads=2)
    overrides = (
        *VLLM, *SHORT_RUN, MEGATRON, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
    )
    # megatron-core's MoE layer trains under TP only with sequence parallelism (verl's default, and here): turned off,
    # that is said before the run, not in its update.
    assets = {**tiny_assets, "model": str(model)}
    without = (*overrides, "actor_rollout_ref.actor.megatron.sequence_parallel=false")
    (problem,) = batch_split_problems(load_config(run_overrides(assets, tmp_path, *without)))
    assert problem.endswith("needs sequence parallelism (megatron-core's MoE layer refuses to train without it): set "
                            "actor_rollout_ref.actor.megatron.sequence_parallel=true, or the tensor parallel size to 1")
    verl_router = "+actor_rollout_ref.actor.megatron.override_transformer_config"
    router_keys = (f"{verl_router}.moe_aux_loss_coeff=0.01", f"{verl_router}.moe_z_loss_coeff=0.001",
                   f"{verl_router}.moe_router_dtype=fp32", f"{verl_router}.moe_permute_fusion=True")
    cfg = load_config(run_overrides(assets, tmp_path / "run", *overrides, *router_keys))
    history = _check_verified_run(run(cfg), str(model))
    (weights,) = model.glob("*.safetensors")
    with safe_open(weights, framework="pt") as handle:
        on_disk = len(list(handle.keys()))  # per-expert tensors, as vLLM loads them
    for record in history[1:]:
        assert record["rollout/sync_tensors"] == on_disk
        # Switch Transformer's loss: 1 for uniform routing, at most experts / active ones.
        assert 1.0 <= record["actor/router_aux_loss"] < EXPERTS / ACTIVE_EXPERTS, record
        assert record["actor/router_z_loss"] > 0, record


def test_online_dpo_step_matches_the_fsdp_backend(ray_cluster, tiny_assets, tmp_path):
    """The unchanged online-DPO recipe: same pairs, same reference log-probs, same loss and gradient."""
    from recipes.config import load_recipe_config
    from recipes.online_dpo import run as run_dpo

    common = (*QUIET, ONE_RANK, "trainer.total_training_steps=1", "trainer.save_at_end=false")
    fsdp = run_dpo(load_recipe_config("online_dpo", run_overrides(tiny_assets, tmp_path / "fsdp", *common)))
    megatron = run_dpo(load_recipe_config("online_dpo", run_overrides(tiny_assets, tmp_path / "mcore", *common, MEGATRON)))
    keys = [k for k in fsdp[0] if k.startswith("dpo/") or k.startswith("pairs/")]
    assert {"dpo/loss", "dpo/chosen_logps", "dpo/grad_norm", "pairs/formed"} <= set(keys)
    for key in keys:
        assert megatron[0][key] == pytest.approx(fsdp[0][key], rel=1e-4, abs=1e-6), key
