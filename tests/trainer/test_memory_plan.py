"""The memory plan of a config: which terms sharding, offload, LoRA, checkpointing, micro-batches and the vLLM
engine change, the fit verdict and the vLLM start-up check. Model folders hold only a config.json (the Qwen2.5-7B
and -3B shapes), which is all the plan reads."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from trainer.config_loader import ConfigError, load_config
from trainer.memory_plan import COLUMNS, build_plan, misfit_message, render_plan
from trainer.memory_plan.engine_profile import SAMPLER_BYTES_PER_LOGIT, SAMPLER_FIXED_BYTES
from trainer.memory_plan.shape import ModelShape, lora_params, lora_targets
from workers.cached_blocks_limit import CACHED_BLOCKS_LIMIT

GIB = 1 << 30
QWEN_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False)
QWEN_3B = dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, intermediate_size=11008, tie_word_embeddings=True)


def scale_config(model: str, *extra: str, lora_rank: int = 0):
    """The GRPO setup of benchmarks/scale_step.py: 8 prompts x 8 responses x 512 tokens on one GPU."""
    cfg = load_config([
        f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=1", "data.max_prompt_length=96",
        "data.max_response_length=512", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.old_log_prob_pass=always", *extra,  # the pass's row is checked too
    ])
    if lora_rank:  # the key of the LoRA branch; set directly so this works before and after it exists
        OmegaConf.update(cfg, "actor_rollout_ref.model.lora_rank", lora_rank, force_add=True)
    return cfg


def plan_of(cfg, gib: float | None = 139.8):
    return build_plan(cfg, int(gib * GIB) if gib else None)


def part(plan, phase: str, column: str) -> float:
    return plan.row(phase).parts[column] / GIB


def logits_part(plan, phase: str) -> float:
    """GiB of logits at the phase's moment that holds them (an update's forward/backward, not its optimizer step)."""
    return max(r.parts["logits"] for g in plan.groups for r in g.rows if r.phase == phase) / GIB


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


def test_the_hybrid_engine_takes_its_share_while_awake_only(folders):
    plan = plan_of(scale_config(folders["3B"], "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"), gib=80)
    assert part(plan, "generate", "engine") == pytest.approx(32.0)
    assert all(part(plan, p, "engine") == 0 for p in ("old_log_prob", "ref_log_prob", "update_actor"))
    awake = plan_of(scale_config(folders["3B"], "actor_rollout_ref.rollout.enable_sleep=false"), gib=80)
    assert part(awake, "update_actor", "engine") == pytest.approx(40.0)
    separate = plan_of(scale_config(folders["3B"], "actor_rollout_ref.rollout.placement=separate",
                                    "actor_rollout_ref.rollout.num_engines=2"), gib=80)
    assert [g.name for g in separate.groups] == ["trainer GPUs", "rollout GPUs"] and separate.groups[1].gpus == 2
    assert part(separate, "generate", "engine") == 0 and separate.groups[1].peak.parts["engine"] == 40 * GIB


def test_a_separate_engine_on_a_share_of_the_trainers_gpu_counts_there_in_every_phase(folders):
    shared = plan_of(scale_config(folders["3B"], "actor_rollout_ref.rollout.placement=separate", "trainer.gpus_per_process=0.5",
                                  "actor_rollout_ref.rollout.gpus_per_engine=0.5", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"), gib=80)
    assert [g.name for g in shared.groups] == ["trainer GPUs"]  # no GPUs of its own
    assert all(part(shared, p, "engine") == pytest.approx(24.0) for p in ("generate", "old_log_prob", "update_actor"))


def startup_profile(config: dict) -> int:
    """What vLLM's start-up profile leaves on an 80 GB GPU beside a fixed KV cache: its sampler over 1024 requests x
    the vocabulary (above these models' forward over 16 384 tokens), and the CUDA graphs' 0.5 GiB."""
    return 1024 * config["vocab_size"] * SAMPLER_BYTES_PER_LOGIT + SAMPLER_FIXED_BYTES + GIB // 2

def test_a_fixed_kv_cache_gives_the_engine_its_weights_the_cache_and_an_allowance(folders):
    """rollout.kv_cache_gib: the engine's share while awake is its weights (engine dtype) + that cache +
    vLLM's start-up profile (`startup_profile`), whatever gpu_memory_utilization and the GPU's size; without it, the
    utilization's share."""
    utilization = "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"
    kv = "actor_rollout_ref.rollout.kv_cache_gib=20"
    weights = 2 * ModelShape.from_config(QWEN_3B).total_params()  # bf16
    share = weights + 20 * GIB + startup_profile(QWEN_3B)
    measured, fixed = (plan_of(scale_config(folders["3B"], utilization, *extra), gib=80) for extra in ((), (kv,)))
    assert measured.row("generate").parts["engine"] == int(0.4 * 80 * GIB)
    assert fixed.row("generate").parts["engine"] == share
    assert fixed.row("init").moment == "vLLM engine started" and fixed.row("init").parts["engine"] == share
    # only the engine's column differs, in the rows it is awake in
    for phase in ("generate", "old_log_prob", "ref_log_prob", "update_actor"):
        difference = {c: fixed.row(phase).parts[c] - measured.row(phase).parts[c] for c in COLUMNS}
        assert difference == {**dict.fromkeys(COLUMNS, 0), "engine": difference["engine"]}
        assert difference["engine"] == (share - int(0.4 * 80 * GIB) if phase == "generate" else 0)
    # the share is known without the GPU's size, and the plan says what it holds
    unknown = plan_of(scale_config(folders["3B"], utilization, kv), gib=None)
    assert unknown.row("generate").parts["engine"] == share
    assert any(n.startswith("the vLLM engine's share per GPU while awake: its weights (5.7 GiB) + "
                            "actor_rollout_ref.rollout.kv_cache_gib (20.0 GiB) + 3.2 GiB") for n in unknown.notes)
    assert not any("the GPU's memory is unknown" in n for n in unknown.notes)
    # an engine dtype of float32 doubles the weights; a separate engine of tensor parallel 2 halves them per GPU
    fp32 = plan_of(scale_config(folders["3B"], kv, "actor_rollout_ref.rollout.dtype=float32"), gib=80)
    assert fp32.row("generate").parts["engine"] == 2 * weights + 20 * GIB + startup_profile(QWEN_3B)
    separate = plan_of(scale_config(folders["3B"], kv, "actor_rollout_ref.rollout.placement=separate",
                                    "actor_rollout_ref.rollout.tensor_model_parallel_size=2"), gib=80)
    assert separate.groups[1].gpus == 2 and separate.groups[1].peak.parts["engine"] == weights // 2 + 20 * GIB + startup_profile(QWEN_3B)
    # on CPU the engine sizes its cache from cpu_kv_cache_mb: the setting changes nothing there
    on_cpu = ("trainer.device=cpu", "actor_rollout_ref.rollout.placement=separate")
    assert render_plan(plan_of(scale_config(folders["3B"], *on_cpu, kv), gib=80)) == render_plan(plan_of(scale_config(folders["3B"], *on_cpu), gib=80))


def test_a_fixed_kv_cache_does_not_shrink_for_a_base_about_to_be_shared(folders):
    """LoRA with the base shared: while the engine starts the actor's copy of the base is still on the GPU. Within
    gpu_memory_utilization vLLM's KV cache makes room for it; a fixed one does not, so the init row holds both."""
    kv = "actor_rollout_ref.rollout.kv_cache_gib=20"
    measured, fixed = (plan_of(scale_config(folders["7B"], *extra, lora_rank=64), gib=80) for extra in ((), (kv,)))
    base = 2 * ModelShape.from_config(QWEN_7B).total_params()
    assert measured.row("init").parts["weights"] == 0
    assert fixed.row("init").moment == "vLLM engine started"
    assert fixed.row("init").parts["weights"] == pytest.approx(base, rel=1e-6)
    adapters = lora_params(ModelShape.from_config(QWEN_7B), 64, lora_targets("all-linear"))
    assert fixed.row("init").parts["engine"] == base + 2 * adapters + 20 * GIB + startup_profile(QWEN_7B)


def test_with_a_fixed_kv_cache_the_utilization_only_gates_the_start(folders):
    """vLLM still requires gpu_memory_utilization x the GPU free at its start, but no longer fits its weights into
    that budget; what it checks instead is that the cache holds one sequence of max_model_len."""
    small = "actor_rollout_ref.rollout.gpu_memory_utilization=0.05"  # 4 GiB of 80: less than the 7B's 14.2 GiB of weights
    (problem,) = plan_of(scale_config(folders["7B"], small), gib=80).problems
    assert problem.startswith("actor_rollout_ref.rollout.gpu_memory_utilization=0.05 gives the vLLM engine 4.0 GiB per GPU, less than its weights (14.2 GiB)")
    assert plan_of(scale_config(folders["7B"], small, "actor_rollout_ref.rollout.kv_cache_gib=20"), gib=80).problems == []
    # the start still needs the utilization's share free, and the message says what the fraction does now
    kept = "actor_rollout_ref.actor.fsdp_config.param_offload=false"  # the models' weights on the GPU at the start
    (problem,) = plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
                                      "actor_rollout_ref.rollout.kv_cache_gib=20", kept)).problems
    assert "asks 111.8 GiB when the hybrid vLLM engine starts" in problem and "lower it to at most 0.69" in problem
    assert problem.endswith("(with actor_rollout_ref.rollout.kv_cache_gib set it only sets this check: the engine takes its "
                            "weights + the KV cache + 3.2 GiB)")
    # offloaded weights leave before the engine starts; with the sync check the actor's come back for it
    assert plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
                                "actor_rollout_ref.rollout.kv_cache_gib=20")).problems == []
    (checked,) = plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
                                      "actor_rollout_ref.rollout.kv_cache_gib=20",
                                      "actor_rollout_ref.rollout.verify_sync=true")).problems
    assert "when the hybrid vLLM engine starts" in checked
    # one sequence of 608 tokens: 28 layers x keys and values x 4 heads x 128 x 2 bytes = 0.03 GiB; checked even
    # without the GPU's size
    (problem,) = plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.kv_cache_gib=0.02"), gib=None).problems
    assert problem == (
        "actor_rollout_ref.rollout.kv_cache_gib=0.02 holds less than one sequence of max_model_len=608 tokens (about "
        "0.04 GiB per GPU); vLLM refuses to start: raise it to at least 0.04 or lower actor_rollout_ref.rollout.max_model_len"
    )
    assert plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.kv_cache_gib=0.04"), gib=None).problems == []
    longer = plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.kv_cache_gib=0.04",
                                  "actor_rollout_ref.rollout.max_model_len=4096"), gib=None)
    assert "max_model_len=4096 tokens (about 0.22 GiB per GPU)" in longer.problems[0]


def test_the_engine_remedy_is_the_setting_that_sizes_its_share(folders):
    awake = "actor_rollout_ref.rollout.enable_sleep=false"  # the engine's share in the update's peak
    fixed = misfit_message(plan_of(scale_config(folders["3B"], awake, "actor_rollout_ref.rollout.kv_cache_gib=60"), gib=80))
    assert "(largest: engine 69.0 GiB" in fixed and "try a smaller actor_rollout_ref.rollout.kv_cache_gib," in fixed
    assert "gpu_memory_utilization" not in fixed
    measured = misfit_message(plan_of(scale_config(folders["3B"], awake, "actor_rollout_ref.rollout.gpu_memory_utilization=0.75"), gib=80))
    assert "(largest: engine 60.0 GiB" in measured and "try a lower actor_rollout_ref.rollout.gpu_memory_utilization," in measured
    assert "kv_cache_gib" not in measured


def test_vllm_refuses_to_start_when_the_resident_models_leave_less_than_its_budget(folders):
    kept = "actor_rollout_ref.actor.fsdp_config.param_offload=false"  # the actor's and reference's weights stay
    plan = plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.gpu_memory_utilization=0.8", kept))
    assert plan.fits() is False
    (problem,) = plan.problems
    assert "asks 111.8 GiB when the hybrid vLLM engine starts" in problem and "lower it to at most 0.69" in problem
    assert misfit_message(plan).startswith("memory plan: actor_rollout_ref.rollout.gpu_memory_utilization=0.8")
    # offloaded, they leave before the engine starts (workers/fsdp/actor_side.py): the start is no problem
    started = plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.gpu_memory_utilization=0.8"))
    assert not any("when the hybrid vLLM engine starts" in p for p in started.problems)


def test_unknown_gpu_memory_prints_without_a_verdict(folders):
    plan = plan_of(scale_config(folders["3B"]), gib=None)
    assert plan.fits() is None
    text = render_plan(plan)
    assert "the GPU's memory is unknown: set trainer.gpu_memory_gib" in text


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


def test_a_lora_base_shared_with_the_hybrid_engine_is_counted_once(folders):
    """rollout.share_base_weights (null: on with LoRA + hybrid vLLM): the base is the engine's, on the GPU in
    every phase (under weights while the engine sleeps), no longer the actor's to offload; its own copy is on
    the GPU only while the engine starts, inside the engine's budget."""
    shared = plan_of(scale_config(folders["7B"], lora_rank=64), gib=80)
    own = plan_of(scale_config(folders["7B"], "actor_rollout_ref.rollout.share_base_weights=false", lora_rank=64), gib=80)
    base = 2 * ModelShape.from_config(QWEN_7B).total_params() / GIB
    assert part(own, "generate", "weights") - part(shared, "generate", "weights") == pytest.approx(base, rel=1e-6)
    adapters = lora_params(ModelShape.from_config(QWEN_7B), 64, lora_targets("all-linear"))
    for phase in ("old_log_prob", "ref_log_prob", "update_actor"):
        # the engine's whole base and its bf16 adapter slots instead of the actor's base shard (one GPU: the same)
        assert part(shared, phase, "weights") - part(own, phase, "weights") == pytest.approx(2 * adapters / GIB, rel=1e-6)
        assert part(shared, phase, "engine") == 0  # the KV cache is freed while the engine sleeps
    init = shared.row("init")
    # the base to be shared sits inside the engine's budget while it starts (vLLM counts what the process holds)
    assert init.moment == "vLLM engine started"
    assert init.parts["weights"] == 0 and init.parts["engine"] == 40 * GIB
    text = render_plan(shared)
    assert "the base is shared with the hybrid vLLM engine" in text and "host memory for the offloaded state" in text
    adapters_and_moments = 12 * adapters / GIB  # float32 adapters and AdamW's two moments: all that moves
    assert f"offloaded state (allocated once, at the first offload): {adapters_and_moments:.1f} GiB" in text
    # Where sharing does not apply the plan is the one without it.
    separate = ("actor_rollout_ref.rollout.placement=separate",)
    assert render_plan(plan_of(scale_config(folders["7B"], *separate, lora_rank=64))) == render_plan(
        plan_of(scale_config(folders["7B"], *separate, "actor_rollout_ref.rollout.share_base_weights=false", lora_rank=64)))


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
