"""The memory plan of a config: which terms sharding, offload, LoRA, checkpointing, micro-batches, a critic and a
reward model change, and the fit verdict (the engine's terms: test_memory_plan_engine.py). Model folders hold only a
config.json (the Qwen2.5-7B and -3B shapes), which is all the plan reads."""

from __future__ import annotations

import pytest

from tests.trainer.memory_plan_cases import GIB, QWEN_3B, QWEN_7B, logits_part, part, plan_of, scale_config
from trainer.config_loader import ConfigError, load_config
from trainer.memory_plan import build_plan, misfit_message, render_plan
from trainer.memory_plan.shape import ModelShape
from workers.cached_blocks_limit import CACHED_BLOCKS_LIMIT


def test_full_fine_tuning_state_is_16_bytes_per_parameter_and_shards_over_the_pool(folders):
    params = ModelShape.from_config(QWEN_7B).total_params()
    one = plan_of(scale_config(folders["7B"]))
    update = one.row("update_actor").parts
    # AdamW's two float32 moments, on the GPU (optimizer_offload) for the step only: the step is the peak
    assert update["optimizer"] == pytest.approx(8 * params, rel=1e-6)
    assert update["grads"] >= 4 * params
    assert one.row("update_actor").moment == "optimizer step"
    kept = plan_of(scale_config(folders["7B"], "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false"))
    # the fused GPU step adds no temporary: the end of the backward, where the root unit's gradients are reduced
    assert kept.row("update_actor").moment == "root gradient reduction"
    # Offloaded models (the reference follows the actor's param_offload) leave before the engine starts.
    assert one.row("init").moment == "vLLM engine started" and part(one, "init", "weights") == 0
    on_gpu = ("actor_rollout_ref.actor.fsdp_config.param_offload=false",
              "actor_rollout_ref.ref.fsdp_config.param_offload=false")
    resident = plan_of(scale_config(folders["7B"], *on_gpu))
    assert part(resident, "init", "weights") == pytest.approx((4 * params + 2 * params) / GIB, rel=1e-6)  # fp32 + bf16
    two = plan_of(scale_config(folders["7B"], *on_gpu, "trainer.n_gpus_per_node=2"))
    assert part(two, "init", "weights") == pytest.approx(part(resident, "init", "weights") / 2, rel=1e-6)
    # A small engine: the moment the models are loaded, before their offload, is the larger one.
    small_engine = plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.gpu_memory_utilization=0.1"))
    assert small_engine.row("init").moment == "models loaded"
    assert part(small_engine, "init", "weights") == pytest.approx(6 * params / GIB, rel=1e-6)
    resident = ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",)
    one, two = (plan_of(scale_config(folders["7B"], *resident, f"trainer.n_gpus_per_node={n}")) for n in (1, 2))
    assert part(one, "old_log_prob", "optimizer") == pytest.approx(8 * params / GIB, rel=1e-6)
    assert part(two, "old_log_prob", "optimizer") == pytest.approx(part(one, "old_log_prob", "optimizer") / 2, rel=1e-6)


def test_the_root_units_gradient_reduction_adds_its_buffers_to_the_backward_where_they_outgrow_a_layers(folders):
    """FSDP reduces the root unit (embedding, final norm, head) last: the float32 reduce-scatter input beside
    first the compute-dtype gradients it copies and then the float32 shard, at the root's size (a CUDA memory
    trace at the Qwen2.5-14B shape on an H200: NVML's update peak was 13% above the plan without this term)."""
    shape = ModelShape.from_config(QWEN_7B)
    assert shape.root_params() > shape.layer_params()
    kept = ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",)
    for gpus, bytes_per_param in ((1, 4 + 4), (2, 4 + 2), (4, 4 + 2)):  # + max(bf16 gradients, float32 shard)
        plan = plan_of(scale_config(folders["7B"], *kept, f"trainer.n_gpus_per_node={gpus}"))
        rows = {r.moment: r for g in plan.groups for r in g.rows if r.phase == "update_actor"}
        extra = rows["root gradient reduction"].total - rows["forward/backward"].total
        assert extra == bytes_per_param * shape.root_params()
    # LoRA reduces only the adapters' gradients: no such moment
    lora = plan_of(scale_config(folders["7B"], *kept, lora_rank=64))
    assert {r.moment for g in lora.groups for r in g.rows if r.phase == "update_actor"} == {"forward/backward"}


def test_7b_full_fine_tuning_fits_one_h200_not_one_h100_and_the_message_says_what_to_change(folders):
    assert plan_of(scale_config(folders["7B"])).fits() is True  # 139.8 GiB
    h100 = ("actor_rollout_ref.rollout.gpu_memory_utilization=0.4",)  # the engine itself starts there
    plan = plan_of(scale_config(folders["7B"], *h100), gib=79.6)
    assert plan.fits() is False and not plan.problems
    message = misfit_message(plan)
    assert "\n" not in message and "update_actor (optimizer step)" in message
    assert "lora_rank" in message and "trainer.memory_check=warn" in message
    # without the reference offload its bf16 weights stay in every phase: the update's peak rises by them
    kept_ref = plan_of(scale_config(folders["7B"], "actor_rollout_ref.ref.fsdp_config.param_offload=false"))
    rise = kept_ref.peak()[1].total - plan_of(scale_config(folders["7B"])).peak()[1].total
    assert rise == 2 * ModelShape.from_config(QWEN_7B).total_params()
    # the full logits would raise the update's peak over the chunked ones (default)
    full_logits = plan_of(scale_config(folders["7B"], "actor_rollout_ref.model.logits_chunk_tokens=0"))
    assert logits_part(full_logits, "update_actor") > 5 * logits_part(plan_of(scale_config(folders["7B"])), "update_actor")


def test_offload_moves_the_actor_state_out_of_the_phases_that_do_not_need_it(folders):
    on = plan_of(scale_config(folders["3B"]))
    off = plan_of(scale_config(folders["3B"], "actor_rollout_ref.actor.fsdp_config.param_offload=false",
                               "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false"))
    # the actor stays from its old log-probs through the reference's to its update
    assert part(off, "ref_log_prob", "weights") == pytest.approx(part(on, "ref_log_prob", "weights"), rel=1e-6)
    assert part(on, "old_log_prob", "optimizer") == 0 and part(off, "old_log_prob", "optimizer") > 0
    assert part(on, "update_actor", "optimizer") == part(off, "update_actor", "optimizer")  # loaded for the step
    assert on.row("update_actor").moment == "optimizer step"
    # loaded for old log-probs; the reference (following param_offload) is on the host then
    ref_weights = 2 * ModelShape.from_config(QWEN_3B).total_params() / GIB
    assert part(off, "old_log_prob", "weights") - part(on, "old_log_prob", "weights") == pytest.approx(ref_weights, rel=1e-6)


def test_lora_trains_adapters_over_a_frozen_bf16_base_and_uses_it_as_the_reference(folders):
    full = plan_of(scale_config(folders["7B"]))
    lora = plan_of(scale_config(folders["7B"], lora_rank=64))
    params = ModelShape.from_config(QWEN_7B).total_params()
    assert part(lora, "init", "weights") < 2.2 * params / GIB  # bf16 base + fp32 adapters, no reference copy
    assert part(lora, "update_actor", "optimizer") < 0.025 * part(full, "update_actor", "optimizer")  # 2.1% of the weights
    assert lora.row("ref_log_prob").role == "actor" and full.row("ref_log_prob").role == "ref"
    assert lora.fits() is True
    assert "LoRA rank 64" in render_plan(lora)


def test_checkpointing_changes_only_the_update_activations(folders):
    # the optimizer state kept on the GPU: the update's peak is the end of the forward, where activations are
    kept = "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false"
    on = plan_of(scale_config(folders["3B"], kept))
    off = plan_of(scale_config(folders["3B"], kept, "actor_rollout_ref.model.enable_gradient_checkpointing=false"))
    assert part(off, "update_actor", "activations") > 5 * part(on, "update_actor", "activations")
    assert part(off, "old_log_prob", "activations") == part(on, "old_log_prob", "activations")
    assert logits_part(off, "update_actor") == logits_part(on, "update_actor")


def test_checkpointing_some_layers_lies_between_none_and_all(folders):
    kept = "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false"
    every = plan_of(scale_config(folders["3B"], kept))
    none = plan_of(scale_config(folders["3B"], kept, "actor_rollout_ref.model.enable_gradient_checkpointing=false"))
    half = plan_of(scale_config(folders["3B"], kept, "actor_rollout_ref.model.gradient_checkpointing_layers=18"))  # of 36
    all_named = plan_of(scale_config(folders["3B"], kept, "actor_rollout_ref.model.gradient_checkpointing_layers=36"))
    activations = {name: part(plan, "update_actor", "activations") for name, plan in
                   (("every", every), ("none", none), ("half", half), ("all_named", all_named))}
    assert activations["all_named"] == activations["every"]
    assert activations["every"] < activations["half"] < activations["none"]
    # half the layers keep their activations: about half of what none-checkpointed keeps
    assert activations["half"] == pytest.approx(activations["none"] / 2, rel=0.1)
    with pytest.raises(ValueError, match=r"gradient_checkpointing_layers=37, but the model has 36 decoder layers; valid: 1 to 36"):
        plan_of(scale_config(folders["3B"], kept, "actor_rollout_ref.model.gradient_checkpointing_layers=37"))


def test_liger_kernels_keep_less_in_the_layers_that_keep_their_activations(folders):
    """Liger's RMSNorm keeps its bf16 input and 1/rms (not a float32 copy and the normalized input) and its SwiGLU
    the gate and up outputs (not SiLU's output): 8h + e*i bytes less per token and kept layer (e = 2 here);
    measured on one H200: 12.9 GiB less over 6 kept layers x 32 768 tokens at the 7B shape (docs/benchmarks.md)."""
    kept = "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false"
    half = "actor_rollout_ref.model.gradient_checkpointing_layers=18"  # of 36: 18 layers keep theirs
    plain = plan_of(scale_config(folders["3B"], kept, half))
    liger = plan_of(scale_config(folders["3B"], kept, half, "actor_rollout_ref.model.use_liger=true"))
    shape = ModelShape.from_config(QWEN_3B)
    rows, length = 8, 96 + 512  # one micro-batch of 8 rows at full length
    per_token_and_layer = 8 * shape.hidden + 2 * shape.intermediate
    saved = rows * length * 18 * per_token_and_layer
    # the final norm and the recomputed layers keep less too; the kept layers' share dominates
    drop = (part(plain, "update_actor", "activations") - part(liger, "update_actor", "activations")) * GIB
    assert saved <= drop < 1.1 * saved
    assert part(liger, "old_log_prob", "activations") == part(plain, "old_log_prob", "activations")


def test_logits_scale_with_the_micro_batch_rows_and_packing_counts_response_tokens(folders):
    # LoRA: the update's peak is the end of the forward (its optimizer step is small), where the logits are.
    full = "actor_rollout_ref.model.logits_chunk_tokens=0"
    eight = plan_of(scale_config(folders["3B"], full, lora_rank=8))
    four = plan_of(scale_config(folders["3B"], full, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", lora_rank=8))
    assert logits_part(four, "update_actor") == pytest.approx(logits_part(eight, "update_actor") / 2)
    assert logits_part(four, "old_log_prob") == pytest.approx(logits_part(eight, "old_log_prob") / 2)
    # 26 bytes per (response token x vocabulary entry) in training: 8 rows x 512 response tokens x 151936
    assert logits_part(eight, "update_actor") == pytest.approx(26 * 8 * 512 * 151936 / GIB)
    budget = plan_of(scale_config(folders["3B"], full, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2048", lora_rank=8))
    assert logits_part(budget, "update_actor") == pytest.approx(26 * 2048 * 151936 / GIB)


def test_chunked_logits_hold_one_chunk_of_the_vocabulary_whatever_the_micro_batch(folders):
    """The default (logits_chunk_tokens=2048): 8 bytes per (chunk token x vocabulary entry) plus, per response
    token, the head's input (kept, and its gradient in training) and the float32 log-probs and entropies."""
    chunked = plan_of(scale_config(folders["3B"], lora_rank=8))
    halved = plan_of(scale_config(folders["3B"], "actor_rollout_ref.model.logits_chunk_tokens=1024", lora_rank=8))
    full = plan_of(scale_config(folders["3B"], "actor_rollout_ref.model.logits_chunk_tokens=0", lora_rank=8))
    tokens, vocab, hidden = 8 * 512, 151936, 2048
    assert logits_part(chunked, "update_actor") == pytest.approx((8 * 2048 * vocab + (2 * 2 * hidden + 8) * tokens) / GIB)
    assert logits_part(chunked, "old_log_prob") == pytest.approx((8 * 2048 * vocab + (2 * hidden + 8) * tokens) / GIB)
    assert logits_part(chunked, "ref_log_prob") == pytest.approx((6 * 2048 * vocab + (2 * hidden + 4) * tokens) / GIB)
    assert logits_part(halved, "update_actor") < 0.51 * logits_part(chunked, "update_actor")
    assert logits_part(full, "update_actor") > 6 * logits_part(chunked, "update_actor")
    megatron = plan_of(scale_config(folders["3B"], "actor_rollout_ref.actor.strategy=megatron"))
    assert logits_part(megatron, "update_actor") == pytest.approx(26 * 8 * 512 * vocab / GIB)  # not chunked there


def test_a_critic_and_a_reward_model_share_the_colocated_gpus_or_get_their_own(folders):
    extra = ("algorithm=ppo", "reward_model.enable=true", f"reward_model.model.path={folders['3B']}")
    colocated = plan_of(scale_config(folders["3B"], *extra), gib=80)
    phases = [r.phase for r in colocated.groups[0].rows]
    assert {"values", "update_critic", "reward_model"} <= set(phases)
    critic_state = ModelShape.from_config(QWEN_3B).total_params("value") * 12 / GIB  # weights + AdamW moments
    assert part(colocated, "old_log_prob", "weights") + part(colocated, "old_log_prob", "optimizer") > critic_state
    separate = plan_of(scale_config(folders["3B"], *extra, "trainer.placement=separate"), gib=80)
    assert [g.name for g in separate.groups] == ["actor GPUs", "critic GPUs", "reward_model GPUs"]


def test_a_model_folder_without_config_json_is_named(tmp_path):
    cfg = scale_config(str(tmp_path))
    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.path=.* has no config.json"):
        build_plan(cfg, 80 * GIB)


def test_lora_7b_with_8192_token_responses_fits_one_h100_only_with_chunked_logits(folders):
    """8 prompts x 4 responses of 8192 tokens, micro-batches of 8 rows: 65536 response tokens, whose float32
    logits alone would be 37 GiB per copy; chunked, the update is far from the GPU's size."""
    long = ("data.max_response_length=8192", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.gpu_memory_utilization=0.5")
    chunked = plan_of(scale_config(folders["7B"], *long, lora_rank=64), gib=79.6)
    full = plan_of(scale_config(folders["7B"], *long, "actor_rollout_ref.model.logits_chunk_tokens=0", lora_rank=64), gib=79.6)
    assert chunked.fits() is True and full.fits() is False
    assert logits_part(chunked, "update_actor") < 3.5 and logits_part(full, "update_actor") > 200
    assert chunked.row("update_actor").total < 60 * GIB


def test_compute_phases_count_the_free_blocks_a_gpu_worker_keeps_between_micro_batches(folders):
    """Up to CACHED_BLOCKS_LIMIT of freed blocks stay reserved between micro-batches (the workers hand back only
    what passes it), on a GPU; the same run's plan on the CPU has no such term, and nothing else differs in
    these rows when nothing is offloaded."""
    resident = ("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.fsdp_config.param_offload=false",
                "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
                "actor_rollout_ref.ref.fsdp_config.param_offload=false")
    gpu = plan_of(scale_config(folders["3B"], *resident))
    cpu = plan_of(scale_config(folders["3B"], *resident, "trainer.device=cpu"))

    def other(plan, phase: str, moment: str) -> int:
        return next(r.parts["other"] for g in plan.groups for r in g.rows if r.phase == phase and r.moment == moment)

    for phase, moment in (("old_log_prob", "log-probs + entropy"), ("ref_log_prob", "log-probs"),
                          ("update_actor", "forward/backward")):
        assert other(gpu, phase, moment) - other(cpu, phase, moment) == CACHED_BLOCKS_LIMIT


def test_no_old_log_prob_row_when_the_update_gives_them(folders):
    kept, skipped = (plan_of(scale_config(folders["7B"], f"actor_rollout_ref.actor.old_log_prob_pass={v}")) for v in ("always", "auto"))
    assert kept.row("old_log_prob") is not None and skipped.row("old_log_prob") is None
    assert skipped.row("update_actor").total == kept.row("update_actor").total
    assert any("no old log-prob pass" in note for note in skipped.notes)


def test_the_reference_row_holds_the_actors_parameters_only_where_a_phase_brought_them(folders):
    """With param_offload the actor's parameters leave while the hybrid engine generates and come back for the
    next phase that computes with the actor (workers/fsdp/residency.py). With the old log-prob pass skipped
    (auto: one optimizer step per batch) that is the update: a separate reference computes without them. With
    the pass, or with LoRA (the reference is the actor, adapters off), they are on the GPU then."""
    params = ModelShape.from_config(QWEN_7B).total_params()
    skipped, kept = (plan_of(scale_config(folders["7B"], f"actor_rollout_ref.actor.old_log_prob_pass={v}")) for v in ("auto", "always"))
    assert skipped.row("old_log_prob") is None and skipped.row("ref_log_prob").role == "ref"
    # the actor's float32 master weights (one GPU): the only difference between the two reference rows
    assert kept.row("ref_log_prob").total - skipped.row("ref_log_prob").total == 4 * params
    assert part(skipped, "ref_log_prob", "weights") < 4 * params / GIB
    # the update brings them back either way
    assert skipped.row("update_actor").parts == kept.row("update_actor").parts
    # without param_offload they never leave: the pass makes no difference to the reference's row
    stay = "actor_rollout_ref.actor.fsdp_config.param_offload=false"
    skipped, kept = (plan_of(scale_config(folders["7B"], stay, f"actor_rollout_ref.actor.old_log_prob_pass={v}")) for v in ("auto", "always"))
    assert skipped.row("ref_log_prob").parts == kept.row("ref_log_prob").parts
    # LoRA: the reference pass is the actor's own forward; its base (not shared here, so the actor's to offload) is in
    own_base = "actor_rollout_ref.rollout.share_base_weights=false"
    skipped, kept = (plan_of(scale_config(folders["7B"], own_base, f"actor_rollout_ref.actor.old_log_prob_pass={v}", lora_rank=64))
                     for v in ("auto", "always"))
    assert skipped.row("old_log_prob") is None and skipped.row("ref_log_prob").role == "actor"
    assert skipped.row("ref_log_prob").parts == kept.row("ref_log_prob").parts
    assert part(skipped, "ref_log_prob", "weights") > 2 * params / GIB  # the bf16 base and more


def test_the_actors_residency_per_phase_follows_the_tenants_that_claim_the_gpu(folders):
    """One rule for every row (trainer/memory_plan/offload_residency.py `actor_residency`): the hybrid engine, a colocated
    critic or reward model send the actor's parameters out; a phase computing with the actor brings them."""
    from trainer.memory_plan.offload_residency import actor_residency
    from trainer.memory_plan.setup import plan_setup

    def residency(*extra: str, lora_rank: int = 0, roles: tuple[str, ...] = ("actor", "ref")) -> dict[str, bool]:
        return actor_residency(plan_setup(scale_config(folders["3B"], *extra, lora_rank=lora_rank), on_gpu=True), set(roles))

    auto, always = "actor_rollout_ref.actor.old_log_prob_pass=auto", "actor_rollout_ref.actor.old_log_prob_pass=always"
    assert residency(auto) == {"reward_model": False, "old_log_prob": False, "ref_log_prob": False, "values": False,
                               "update_critic": False, "update_actor": True}
    assert residency(always)["ref_log_prob"] and residency(auto, lora_rank=8)["ref_log_prob"]
    # HF generate computes with the actor and a separate engine's process claims nothing here: they stay
    assert residency(auto, "actor_rollout_ref.rollout.name=hf")["ref_log_prob"]
    assert residency(auto, "actor_rollout_ref.rollout.placement=separate")["ref_log_prob"]
    # a colocated reward model scores before the log-probs and claims the GPU
    scored = residency(auto, "actor_rollout_ref.rollout.name=hf", roles=("actor", "ref", "reward_model"))
    assert not scored["reward_model"] and not scored["ref_log_prob"] and scored["update_actor"]
    # a colocated critic claims the GPU for its values and update, after the reference's log-probs
    critic = residency(always, roles=("actor", "ref", "critic"))
    assert critic["ref_log_prob"] and not critic["values"] and not critic["update_critic"] and critic["update_actor"]


def test_a_colocated_critic_computes_without_the_actors_offloaded_parameters(folders):
    """PPO with the KL as a loss (no KL in the reward): the old log-prob pass is skipped, and the critic's rows
    hold the critic's and the reference's state but none of the actor's offloaded parameters, as they did with it."""
    ppo = ("algorithm=ppo", "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true",
           "actor_rollout_ref.rollout.n=8")
    skipped, kept = (plan_of(scale_config(folders["3B"], *ppo, f"actor_rollout_ref.actor.old_log_prob_pass={v}"), gib=80)
                     for v in ("auto", "always"))
    assert skipped.row("old_log_prob") is None and kept.row("old_log_prob") is not None
    for phase in ("values", "update_critic"):
        assert skipped.row(phase).parts == kept.row(phase).parts
    # the actor's parameters (float32, one GPU) are in the reference's row only with the pass
    params = ModelShape.from_config(QWEN_3B).total_params()
    assert kept.row("ref_log_prob").total - skipped.row("ref_log_prob").total == 4 * params


def test_a_checkpointed_layer_count_below_one_is_refused_before_ray_starts():
    """Refused when the config loads (the workers' schema), before any plan or Ray."""
    expected = r"'actor_rollout_ref.model.gradient_checkpointing_layers' must be None \(every decoder layer recomputes\) or an int >= 1.*got 0"
    with pytest.raises(ConfigError, match=expected):
        load_config(["actor_rollout_ref.model.gradient_checkpointing_layers=0"])


def test_megatron_recomputes_its_layers_when_checkpointing_is_asked(folders):
    """model.enable_gradient_checkpointing=true recomputes every Megatron layer in the backward: each keeps its input
    only, as the FSDP workers' checkpointed layers do (one GPU: no tensor-parallel split)."""
    megatron = "actor_rollout_ref.actor.strategy=megatron"
    recomputed = plan_of(scale_config(folders["3B"], megatron))
    kept = plan_of(scale_config(folders["3B"], megatron, "actor_rollout_ref.model.enable_gradient_checkpointing=false"))
    fsdp = plan_of(scale_config(folders["3B"]))
    activations = {name: max(r.parts["activations"] for g in plan.groups for r in g.rows if r.phase == "update_actor")
                   for name, plan in (("recomputed", recomputed), ("kept", kept), ("fsdp", fsdp))}
    assert activations["recomputed"] < activations["kept"] / 4
    assert activations["recomputed"] == activations["fsdp"]
