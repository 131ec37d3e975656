"""The memory plan's vLLM engine: its share of the GPU while awake (hybrid) or in every phase (separate on a share of
the trainer's GPU), a fixed KV cache, the start-up check and the remedy it names, a LoRA base shared with it."""

from __future__ import annotations

import pytest

from tests.trainer.memory_plan_cases import GIB, QWEN_3B, QWEN_7B, part, plan_of, scale_config
from trainer.memory_plan import COLUMNS, misfit_message, render_plan
from trainer.memory_plan.engine_profile import SAMPLER_BYTES_PER_LOGIT, SAMPLER_FIXED_BYTES
from trainer.memory_plan.shape import ModelShape, lora_params, lora_targets


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
