"""The worker config sections' keys: each leaf a `Field` (its pydantic type and the words an error shows), nested
dicts for sub-sections. The defaults are in workers/defaults/<section>.yaml (one per section, the same keys:
tests/workers/test_config_defaults_source.py); workers/config.py completes and checks a user's section with them."""

from __future__ import annotations

from typing import Any

from workers.cached_blocks_limit import RELEASE_POINTS
from workers.config_fields import (
    Field,
    any_int,
    betas,
    boolean,
    config_fields,
    engine_kwargs_mapping,
    float_in,
    int_at_least,
    module_names,
    non_empty_str,
    one_of,
    optional,
    shard_group_size,
    spec_list,
    token_ids,
)
from workers.config_spec_megatron import megatron_spec, ref_megatron_spec
from workers.dtypes import DTYPE_NAMES
from workers.rl_math.names import (
    KL_PENALTY_NAMES,
    LOSS_AGG_MODES,
    OLD_LOG_PROB_PASS_CHOICES,
    POLICY_LOSS_MODES,
    ROUTER_REPLAY_MODES,
)
from workers.rollout_choices import PARTIAL_ROLLOUT_MODES, ROLLOUT_MODES, STALE_GROUP_POLICIES, STALENESS_VALUES

ROLLOUT_ENGINES = ("hf", "vllm")
ROLLOUT_PLACEMENTS = ("hybrid", "separate")
LR_SCHEDULERS = ("constant", "cosine")
STRATEGIES = ("fsdp", "megatron")


def _release_field() -> Field:
    return Field(
        one_of(*RELEASE_POINTS),
        f"one of {list(RELEASE_POINTS)} (when the caching allocator's free blocks beyond its peak go back to the GPU)",
    )


def multi_turn_spec() -> dict[str, Any]:
    """Multi-turn tool-calling rollouts (workers/rollout/agent, docs/agents.md)."""
    return {
        "enable": Field(boolean, "a bool (generate with tool calls over several turns)"),
        "format": Field(one_of("hermes", "tiny"), "one of ['hermes', 'tiny'] (how tool calls are written)"),
        "tools": Field(spec_list, "a list of 'path/to/file.py:function' strings"),
        "environment": Field(optional(non_empty_str), "None or 'path/to/file.py:EnvironmentClass'"),
        "tool_role": Field(non_empty_str, "the chat-template role of tool results (a string)"),
        "max_turns": Field(int_at_least(1), "an int >= 1 (model turns per conversation)"),
        "max_tokens_per_turn": Field(optional(int_at_least(1)), "None (the response length) or an int >= 1"),
        "tool_timeout_s": Field(float_in(0.0, low_open=True), "a float > 0 (seconds per tool call)"),
        "tool_max_output_chars": Field(int_at_least(1), "an int >= 1 (longer tool output is cut)"),
    }


TOP_K_EXPECTED = "an int: -1 or 0 (off; verl writes -1) or >= 1 (sample from the k likeliest tokens)"


def val_kwargs_spec() -> dict[str, Any]:
    """verl's rollout.val_kwargs: how validation samples (the driver's setting: trainer/validation.py)."""
    return {
        "temperature": Field(float_in(0.0), "a float >= 0 (0: greedy, as vLLM reads it)"),
        "top_p": Field(float_in(0.0, 1.0, low_open=True), "a float in (0, 1]"),
        "top_k": Field(int_at_least(-1), TOP_K_EXPECTED),
        "do_sample": Field(boolean, "a bool (false: greedy whatever the temperature)"),
        "n": Field(int_at_least(1), "an int >= 1 (responses per validation prompt; metrics mean@n)"),
    }


def _ulysses_field() -> Field:
    return Field(
        int_at_least(1),
        "an int >= 1 (Ulysses: ranks sharing each packed sequence; divides the workers and the attention heads)",
    )


def _strategy_field(role: str) -> Field:
    return Field(
        one_of(*STRATEGIES),
        f"one of {list(STRATEGIES)} (training backend of the {role}; megatron: pip install -e \".[megatron]\")",
    )

MODEL_SPEC: dict[str, Any] = {
    "path": Field(non_empty_str, "a local directory or hub id (string)"),
    "dtype": Field(one_of(*DTYPE_NAMES), f"one of {list(DTYPE_NAMES)} (auto: bfloat16 on GPU, float32 on CPU)"),
    "enable_gradient_checkpointing": Field(boolean, "a bool"),
    "gradient_checkpointing_layers": Field(
        optional(int_at_least(1)), "None (every decoder layer recomputes) or an int >= 1 (the first N decoder "
        "layers recompute; the rest keep their activations)"
    ),
    "attn_implementation": Field(optional(non_empty_str), "None (HF default) or e.g. 'sdpa', 'eager'"),
    "use_remove_padding": Field(
        optional(boolean),
        "None (packed, padding-free forwards where the model supports them), true (required) or false",
    ),
    "use_liger": Field(boolean, "a bool (Liger's Triton kernels for RMSNorm, SwiGLU and rotary embedding; FSDP on a "
                       "CUDA GPU, pip install -e \".[liger]\")"),
    "override_config": Field(config_fields, "a mapping of config.json fields to values (verl's key: they replace the "
                             "folder's values when the model is built, in the trainer and the engine)"),
}


# LoRA (verl's keys), actor only: lora_rank > 0 trains adapters of that rank instead of every weight.
ACTOR_MODEL_SPEC: dict[str, Any] = {
    **MODEL_SPEC,
    "lora_rank": Field(int_at_least(0), "an int >= 0 (0: train every weight; > 0: LoRA adapters of this rank)"),
    "lora_alpha": Field(float_in(0.0, low_open=True), "a float > 0 (LoRA scaling is lora_alpha / lora_rank)"),
    "target_modules": Field(module_names, "'all-linear' or a list of module names, e.g. [q_proj, v_proj]"),
    "exclude_modules": Field(optional(module_names), "None or a module name / list of names kept without LoRA"),
    # FSDP actor and reference; megatron computes vocabulary-parallel logits (workers/megatron/vocab_parallel.py).
    "logits_chunk_tokens": Field(
        int_at_least(0),
        "an int >= 0 (log-probs and entropy from the LM head this many tokens at a time, without the full logits; "
        "0: full logits)",
    ),
}


def _fsdp_size_field(role: str) -> Field:
    return Field(
        shard_group_size,
        f"-1 (the {role} shards over every rank) or an int >= 1 dividing the ranks (hybrid sharding: shards within "
        "groups of that many consecutive ranks, replicas across the groups)",
    )


def _fsdp_config_spec(role: str) -> dict[str, Any]:
    """verl's `fsdp_config` of a trained model: its shard group size and its offload switches
    (workers/fsdp/residency.py moves the state)."""
    return {
        "fsdp_size": _fsdp_size_field(role),
        "param_offload": Field(
            boolean, f"a bool (keep the {role}'s parameters on the host between phases; GPU only)"
        ),
        "optimizer_offload": Field(
            boolean, f"a bool (keep the {role}'s optimizer state on the host between updates; GPU only)"
        ),
    }


def optim_spec() -> dict[str, Any]:
    return {
        "lr": Field(float_in(0.0), "a float >= 0"),
        "weight_decay": Field(float_in(0.0), "a float >= 0"),
        "betas": Field(betas, "two floats in [0, 1]"),
        "eps": Field(float_in(0.0, low_open=True), "a float > 0"),
        # verl's keys and rule: lr_warmup_steps <= 0 (or None) takes int(lr_warmup_steps_ratio x total_training_steps).
        "lr_warmup_steps": Field(
            optional(any_int), "None or an int (> 0: warmup steps; <= 0: from lr_warmup_steps_ratio)"
        ),
        "lr_warmup_steps_ratio": Field(
            float_in(0.0, 1.0), "a float in [0, 1] (warmup as a fraction of total_training_steps)"
        ),
        "lr_scheduler_type": Field(one_of(*LR_SCHEDULERS), f"one of {list(LR_SCHEDULERS)}"),
        "min_lr_ratio": Field(float_in(0.0, 1.0), "a float in [0, 1] (cosine floor, as a fraction of lr)"),
        "num_cycles": Field(float_in(0.0), "a float >= 0 (cosine waves over the run; 0.5: down to the floor once)"),
        "total_training_steps": Field(optional(int_at_least(1)), "None or an int >= 1 (set by the trainer)"),
    }


def _dynamic_forward_spec(prefix: str) -> dict[str, Any]:
    """Token-budget micro-batches of a forward-only pass (log-probs)."""
    return {
        f"{prefix}_use_dynamic_bsz": Field(
            boolean, f"a bool (micro-batches filled up to {prefix}_max_token_len_per_gpu tokens)"
        ),
        f"{prefix}_max_token_len_per_gpu": Field(
            int_at_least(1), "an int >= 1 (tokens per micro-batch with the dynamic batch size)"
        ),
    }


def _ppo_spec() -> dict[str, Any]:
    """Keys shared by the actor and the critic updates."""
    return {
        "ppo_epochs": Field(int_at_least(1), "an int >= 1"),
        "ppo_mini_batch_size": Field(
            int_at_least(1), "an int >= 1 (prompts per optimizer step, global over all ranks)"
        ),
        "ppo_micro_batch_size_per_gpu": Field(int_at_least(1), "an int >= 1"),
        "grad_clip": Field(float_in(0.0, low_open=True), "a float > 0"),
        "loss_agg_mode": Field(one_of(*LOSS_AGG_MODES), f"one of {list(LOSS_AGG_MODES)}"),
        "shuffle": Field(boolean, "a bool"),
        "use_dynamic_bsz": Field(
            boolean, "a bool (micro-batches filled up to ppo_max_token_len_per_gpu tokens instead of a row count)"
        ),
        "ppo_max_token_len_per_gpu": Field(
            int_at_least(1), "an int >= 1 (tokens per update micro-batch with use_dynamic_bsz)"
        ),
    }


ACTOR_ROLLOUT_REF_SPEC: dict[str, Any] = {
    "seed": Field(int_at_least(0), "an int >= 0 (LoRA adapter init, mini-batch shuffling; sampling adds the rank)"),
    "release_cached_blocks": _release_field(),
    "model": ACTOR_MODEL_SPEC,
    "actor": {
        "optim": optim_spec(),
        **_ppo_spec(),
        "clip_ratio_low": Field(float_in(0.0), "a float >= 0"),
        "clip_ratio_high": Field(float_in(0.0), "a float >= 0"),
        "clip_ratio_c": Field(float_in(1.0, low_open=True), "a float > 1 (dual-clip bound)"),
        "policy_loss": {
            "loss_mode": Field(
                one_of(*POLICY_LOSS_MODES), f"one of {list(POLICY_LOSS_MODES)} (token-level PPO ratio, GSPO's "
                "sequence ratio, or GMPO's geometric mean)"
            ),
        },
        "entropy_coeff": Field(float_in(), "a float"),
        "router_aux_loss_coef": Field(
            optional(float_in(0.0)), "None (off) or a float >= 0 (a mixture-of-experts model's load-balancing loss)"
        ),
        "router_replay": {
            "mode": Field(
                one_of(*ROUTER_REPLAY_MODES), f"one of {list(ROUTER_REPLAY_MODES)} (a mixture of experts' update "
                "routes live, or replays the experts the log-prob pass (R2) or the rollout (R3) chose)"
            ),
        },
        "use_kl_loss": Field(boolean, "a bool"),
        "kl_loss_coef": Field(float_in(0.0), "a float >= 0"),
        "kl_loss_type": Field(one_of(*KL_PENALTY_NAMES), f"one of {list(KL_PENALTY_NAMES)}"),
        # The driver's setting (trainer/old_log_prob_pass.py); the update sees only whether old_log_probs came.
        "old_log_prob_pass": Field(one_of(*OLD_LOG_PROB_PASS_CHOICES), f"one of {list(OLD_LOG_PROB_PASS_CHOICES)}"),
        "strategy": _strategy_field("actor and reference"),
        "ulysses_sequence_parallel_size": _ulysses_field(),
        "megatron": megatron_spec(),
        "fsdp_config": _fsdp_config_spec("actor"),
    },
    "rollout": {
        "name": Field(
            one_of(*ROLLOUT_ENGINES), f"one of {list(ROLLOUT_ENGINES)} (HF generate on the FSDP model, or vLLM)"
        ),
        "placement": Field(
            one_of(*ROLLOUT_PLACEMENTS),
            f"one of {list(ROLLOUT_PLACEMENTS)} (vllm: in the actor's processes, or its own pool)",
        ),
        "num_engines": Field(
            int_at_least(1), "an int >= 1 (vllm separate placement: engine replicas, each on "
            "tensor_model_parallel_size devices)"
        ),
        "tensor_model_parallel_size": Field(int_at_least(1), "an int >= 1 (vllm; > 1 needs placement=separate)"),
        "gpus_per_engine": Field(
            optional(float_in(0.0, 1.0, low_open=True)), "None (tensor_model_parallel_size) or a fraction in (0, 1] "
            "(vllm separate, tensor_model_parallel_size 1)"
        ),
        "gpu_memory_utilization": Field(float_in(0.0, 1.0, low_open=True), "a float in (0, 1] (vllm on GPU)"),
        "cpu_kv_cache_mb": Field(int_at_least(1), "an int >= 1 (vllm on CPU: KV-cache size in MiB)"),
        "kv_cache_gib": Field(
            optional(float_in(0.0, low_open=True)), "None (vLLM sizes its KV cache within gpu_memory_utilization) "
            "or a number > 0 (vllm on GPU: a fixed KV-cache size in GiB per GPU)"
        ),
        "enforce_eager": Field(
            optional(boolean), "None (CUDA graphs on a GPU, eager on CPU) "
            "or a bool (vllm: true = no CUDA graphs / torch.compile)"
        ),
        "cuda_graph_max_batch": Field(
            optional(int_at_least(1)), "None (the sequences one engine decodes at once, set by the trainer) "
            "or an int >= 1 (vllm on GPU: the largest decode batch captured as a CUDA graph)"
        ),
        "engine_process": Field(
            optional(boolean), "None (the worker's process; the trainer picks for its separate engines) or a bool "
            "(vllm: the engine's core in a process of its own; a hybrid engine of tensor parallel > 1: true = in the "
            "first rank's worker processes, false = one shard in each trainer rank's process)"
        ),
        "enable_sleep": Field(
            boolean, "a bool (vllm hybrid on GPU: release weights and KV cache while the actor trains)"
        ),
        "free_cache_engine": Field(boolean, "a bool (vllm: actually sleep after each generate when enable_sleep)"),
        "enable_chunked_prefill": Field(
            optional(boolean), "None (on a GPU, off on CPU) or a bool (vllm: long prompts prefilled in "
            "chunks of max_num_batched_tokens, mixed with decoding; always off on CPU)"
        ),
        "max_num_batched_tokens": Field(
            optional(int_at_least(1)), "None (vLLM's default) or an int >= 1 (vllm: tokens one engine step "
            "schedules; without chunked prefill at least max_model_len)"
        ),
        "max_num_seqs": Field(
            optional(int_at_least(1)), "None (vLLM's default) or an int >= 1 (vllm: sequences one engine step runs)"
        ),
        "engine_kwargs": Field(
            engine_kwargs_mapping, "a mapping {vllm: {argument: value}} (extra arguments of vLLM's engine)"
        ),
        "share_base_weights": Field(
            optional(boolean), "None (where possible) or a bool (LoRA with a hybrid vllm engine: the actor's frozen "
            "base weights are views of the engine's, one copy on the device)"
        ),
        "max_model_len": Field(
            optional(int_at_least(1)), "None (prompt + response length, set by the trainer) or an int >= 1"
        ),
        "dtype": Field(one_of(*DTYPE_NAMES), f"one of {list(DTYPE_NAMES)} (vllm; auto: the actor's compute dtype)"),
        "weight_sync_bucket_mb": Field(int_at_least(1), "an int >= 1 (MiB per weight-sync bucket)"),
        "verify_sync": Field(
            boolean, "a bool (after each sync, compare the engine's log-probs of a probe batch with the trainer's)"
        ),
        "verify_tolerance": Field(optional(float_in(0.0, low_open=True)), "None (1e-3 fp32, 0.25 bf16) or a float > 0"),
        "staleness": Field(
            one_of(*STALENESS_VALUES), "0 or 1 (driver side: steps between generating and training on a batch)"
        ),
        "tis_imp_ratio_cap": Field(
            optional(float_in(1.0)), "None (off) or a float >= 1 (driver side: truncated IS cap)"
        ),
        "mode": Field(one_of(*ROLLOUT_MODES), f"one of {list(ROLLOUT_MODES)} (verl's; the same rollout here)"),
        "async_training": Field(
            boolean, "a bool (driver side, vllm separate: the engines stream finished prompt groups)"
        ),
        "max_staleness": Field(
            int_at_least(0), "an int >= 0 (async_training: weight versions a group may lag behind its update)"
        ),
        "stale_groups": Field(
            one_of(*STALE_GROUP_POLICIES),
            f"one of {list(STALE_GROUP_POLICIES)} (async_training: a group about to exceed max_staleness)",
        ),
        "partial_rollout": Field(
            one_of(*PARTIAL_ROLLOUT_MODES),
            f"one of {list(PARTIAL_ROLLOUT_MODES)} (async_training: responses in flight at a weight update)",
        ),
        "n": Field(int_at_least(1), "an int >= 1 (responses per prompt; the driver repeats the prompts)"),
        "temperature": Field(float_in(0.0, low_open=True), "a float > 0"),
        "top_p": Field(float_in(0.0, 1.0, low_open=True), "a float in (0, 1]"),
        "top_k": Field(int_at_least(-1), TOP_K_EXPECTED),
        "response_length": Field(int_at_least(1), "an int >= 1 (max new tokens)"),
        "do_sample": Field(boolean, "a bool"),
        "ignore_eos": Field(
            boolean, "a bool (keep sampling past EOS: every response is response_length tokens, all trained on)"
        ),
        "eos_token_id": Field(optional(token_ids), "None (from the model) or an int / list of ints"),
        "pad_token_id": Field(optional(int_at_least(0)), "None (from the model) or an int"),
        "log_prob_micro_batch_size_per_gpu": Field(int_at_least(1), "an int >= 1"),
        "enable_rollout_routing_replay": Field(
            boolean, "a bool (a mixture of experts' rollout returns the experts each token was routed to)"
        ),
        "multi_turn": multi_turn_spec(),
        "val_kwargs": val_kwargs_spec(),
        **_dynamic_forward_spec("log_prob"),
    },
    "ref": {
        "log_prob_micro_batch_size_per_gpu": Field(int_at_least(1), "an int >= 1"),
        "ulysses_sequence_parallel_size": Field(
            optional(int_at_least(1)), "None (the actor's ulysses_sequence_parallel_size) or the actor's size"
        ),
        **_dynamic_forward_spec("log_prob"),
        "fsdp_config": {
            "fsdp_size": _fsdp_size_field("reference"),
            "param_offload": Field(
                boolean, "a bool (keep the reference's parameters on the host outside its log-prob pass; GPU only)"
            ),
        },
        "megatron": ref_megatron_spec(),
    },
}

# verl's place for the critic's offload switches: critic.model.fsdp_config.
CRITIC_MODEL_SPEC: dict[str, Any] = {**MODEL_SPEC, "fsdp_config": _fsdp_config_spec("critic")}

CRITIC_SPEC: dict[str, Any] = {
    "seed": Field(int_at_least(0), "an int >= 0 (value-head init and mini-batch shuffling)"),
    "release_cached_blocks": _release_field(),
    "model": CRITIC_MODEL_SPEC,
    "optim": optim_spec(),
    **_ppo_spec(),
    "strategy": _strategy_field("critic"),
    "ulysses_sequence_parallel_size": _ulysses_field(),
    "megatron": megatron_spec(),
    "rollout_n": Field(int_at_least(1), "an int >= 1 (responses per prompt: ppo_mini_batch_size x rollout_n rows)"),
    "forward_micro_batch_size_per_gpu": Field(int_at_least(1), "an int >= 1"),
    "forward_max_token_len_per_gpu": Field(
        int_at_least(1), "an int >= 1 (tokens per compute_values micro-batch with use_dynamic_bsz)"
    ),
    "cliprange_value": Field(float_in(0.0), "a float >= 0"),
}

REWARD_MODEL_SPEC: dict[str, Any] = {
    "seed": Field(int_at_least(0), "an int >= 0 (init of a score head missing from the checkpoint)"),
    "release_cached_blocks": _release_field(),
    "model": MODEL_SPEC,
    "micro_batch_size_per_gpu": Field(int_at_least(1), "an int >= 1"),
    "use_dynamic_bsz": Field(boolean, "a bool (micro-batches filled up to forward_max_token_len_per_gpu tokens)"),
    "forward_max_token_len_per_gpu": Field(
        int_at_least(1), "an int >= 1 (tokens per micro-batch with use_dynamic_bsz)"
    ),
}


# Where each worker section sits in the trainer's config.
WORKER_SECTIONS = {
    "actor_rollout_ref": ACTOR_ROLLOUT_REF_SPEC, "critic": CRITIC_SPEC, "reward_model": REWARD_MODEL_SPEC,
}
