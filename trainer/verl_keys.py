"""verl's config keys that have no key of the same name here: what each one is, and what a launch script that
sets it gets. Two kinds:

- hints: settings of verl's kernels or engines that change speed, never results, and have nothing to change here
  (this project's own way is named in `why`). The run accepts them and says once that they do nothing;
- refused: settings whose meaning this project does not have, or has under another key (`nearest`). The run
  stops before anything starts, with one line per key.

A key may be a hint only at the values that match what this project does anyway (`hint_values`), and refused at
the others: `hybrid_engine=true` (engine in the actor's processes) is what happens here, `false` is not.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True)
class VerlKey:
    pattern: str  # a dotted key; `*` matches any part of it (`actor_rollout_ref.*.use_torch_compile`)
    why: str  # what it does in verl and what this project does instead
    nearest: str = ""  # the key to use here, where one comes close
    # accepted and reported once as doing nothing here: True at any value, or a tuple of the values (as written on
    # the command line, lower case) that are hints
    hint: bool | tuple[str, ...] = False

    @property
    def hint_values(self) -> tuple[str, ...]:
        return self.hint if isinstance(self.hint, tuple) else ()

    def is_hint(self, value: str | None) -> bool:
        if not self.hint:
            return False
        return not self.hint_values or (value is not None and normalized(value) in self.hint_values)

    def line(self, key: str, value: str | None, where: str = "") -> str:
        shown = (key if value is None else f"{key}={value}") + where
        use = f"; use {self.nearest}" if self.nearest else ""
        if self.hint and not self.is_hint(value):
            return f"{shown}: {self.why}; only {list(self.hint_values)} is accepted here{use}"
        return f"{shown}: {self.why}{use}"


def normalized(value: str) -> str:
    """A value as written on a command line or in yaml, compared without quotes, spaces and case:
    `"['model', 'optimizer']"` -> `[model,optimizer]`."""
    return "".join(ch for ch in value.lower() if ch not in " '\"")


_CHUNKED_LOGITS = (
    "log-probs and entropy come from the LM head in chunks of model.logits_chunk_tokens here, without the full logits"
)
_FSDP_WRAP = "FSDP2 shards each decoder layer here"
_MEGATRON_RECOMPUTE = (
    "Megatron's layers are recomputed here (all of them, one at a time: verl's recompute_granularity=full, "
    "recompute_method=uniform, recompute_num_layers=1) when the model's gradient checkpointing is on"
)
# megatron-core's fused kernels and token dispatchers, which verl's Megatron scripts switch on: they change speed only.
MEGATRON_KERNEL_KEYS = (
    "apply_rope_fusion", "masked_softmax_fusion", "bias_activation_fusion", "bias_dropout_fusion",
    "gradient_accumulation_fusion", "persist_layer_norm", "cross_entropy_loss_fusion", "use_flash_attn",
    "attention_backend", "moe_grouped_gemm", "moe_permute_fusion", "moe_router_fusion", "moe_enable_deepep",
    "moe_token_dispatcher_type", "moe_shared_expert_overlap",
)
_MEGATRON_KERNELS = (
    "megatron-core's layers are built here without Transformer Engine, Apex or DeepEP: the plain-torch kernels, "
    "experts as a SequentialMLP, tokens exchanged by all-to-all"
)
_MICRO_GLOBAL = "verl's deprecated global micro-batch size; micro-batches are per GPU here"

VERL_KEYS: tuple[VerlKey, ...] = (
    # Speed hints with nothing to change here.
    VerlKey("actor_rollout_ref.*.use_fused_kernels", _CHUNKED_LOGITS, hint=True),
    VerlKey("actor_rollout_ref.model.fused_kernel_options.*", _CHUNKED_LOGITS, hint=True),
    VerlKey("critic.*entropy*", "the critic computes values only, no entropy", hint=True),
    VerlKey("*.entropy_from_logits_with_chunking", _CHUNKED_LOGITS, hint=True),
    VerlKey("*.entropy_checkpointing", _CHUNKED_LOGITS, hint=True),
    VerlKey("*.use_torch_compile", "the trainer's forward and backward run eagerly here", hint=True),
    VerlKey("*fsdp_config.wrap_policy.*", _FSDP_WRAP, hint=True),
    VerlKey("*fsdp_config.forward_prefetch", _FSDP_WRAP + " with torch's default prefetching", hint=True),
    VerlKey("*fsdp_config.reshard_after_forward", _FSDP_WRAP + " and reshards it after each forward",
            hint=("true",)),
    VerlKey("*fsdp_config.use_orig_params", "FSDP2 always keeps the original parameters", hint=True),
    VerlKey("reward_model.model.fsdp_config.fsdp_size", "the reward model shards over all of its ranks (no hybrid "
            "sharding)", hint=("-1",)),
    VerlKey("*fsdp_config.offload_policy", "FSDP's CPU offload policy is not used; offloading here moves whole "
            "phases' parameters", nearest="fsdp_config.param_offload", hint=("false",)),
    VerlKey("actor_rollout_ref.rollout.layered_summon", "weights go to the engine in buckets of "
            "rollout.weight_sync_bucket_mb here, never the whole model at once", hint=True),
    VerlKey("actor_rollout_ref.rollout.multi_stage_wake_up", "the engine's wake-up order is fixed here "
            "(rollout.enable_sleep decides whether it sleeps at all)", hint=True),
    VerlKey("actor_rollout_ref.rollout.load_format", "the engine loads the model folder's weights at its start and "
            "receives the trainer's at every weight sync", hint=True),
    VerlKey("actor_rollout_ref.hybrid_engine", "the actor and its engine share processes here with "
            "rollout.placement=hybrid (the default)", nearest="actor_rollout_ref.rollout.placement",
            hint=("true",)),
    VerlKey("trainer.use_legacy_worker_impl", "this project has one worker implementation", hint=True),
    VerlKey("trainer.ray_wait_register_center_timeout", "workers register with Ray directly here", hint=True),
    VerlKey("data.filter_overlong_prompts_workers", "prompts are filtered in the driver process here", hint=True),
    VerlKey("data.dataloader_num_workers", "the prompt feed reads parquet in the driver process here", hint=True),
    # Settings with nothing to act on here, and verl defaults that are what happens here anyway (hint_values).
    VerlKey("*.trust_remote_code", "models and tokenizers load with transformers' own classes here", hint=("false",)),
    VerlKey("*.use_shm", "models and data are read from their folders here, with no copy in /dev/shm", hint=True),
    VerlKey("*.optim.optimizer", "the optimizer is AdamW here (Megatron's own Adam under strategy=megatron)",
            hint=("adamw",)),
    VerlKey("*.optim.optimizer_impl", "the FSDP workers use torch.optim.AdamW here", hint=("torch.optim",)),
    VerlKey("*.optim.override_optimizer_config", "no extra optimizer arguments are passed here; the optim keys "
            "are the settings", hint=("null", "none")),
    *(VerlKey(f"*.optim.override_optimizer_config.{name}", "megatron-core's optimizer steps on the GPU here; "
              "megatron.optimizer_offload keeps its float32 state on the host outside the step (the same Adam)",
              nearest="actor_rollout_ref.actor.megatron.optimizer_offload", hint=True)
      for name in ("optimizer_cpu_offload", "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d",
                   "use_precision_aware_optimizer")),
    VerlKey("*.optim.lr_decay_style", "verl's Megatron name of the LR schedule; one key serves both backends here",
            nearest="actor_rollout_ref.actor.optim.lr_scheduler_type", hint=("constant",)),
    VerlKey("actor_rollout_ref.actor.calculate_entropy", "the update always computes the entropy here (actor/entropy)",
            hint=True),
    VerlKey("actor_rollout_ref.actor.loss_scale_factor", "seq-mean-token-sum-norm divides by the padded response "
            "length here (verl's null)", hint=("null", "none")),
    VerlKey("*.checkpoint.async_save", "checkpoints are written synchronously here", hint=("false",)),
    VerlKey("actor_rollout_ref.ref.fsdp_config.optimizer_offload", "the reference has no optimizer", hint=True),
    VerlKey("actor_rollout_ref.ref.fsdp_config.forward_only", "the reference only computes log-probs here",
            hint=("true",)),
    VerlKey("*fsdp_config.forward_only", "the actor and the critic train here", hint=("false",)),
    VerlKey("*fsdp_config.strategy", "the FSDP workers here use FSDP2; the role's strategy key chooses fsdp or "
            "megatron", hint=("fsdp", "fsdp2")),
    VerlKey("*fsdp_config.full_determinism", "torch's deterministic algorithms are not forced here", hint=("false",)),
    VerlKey("actor_rollout_ref.nccl_timeout", "NCCL collectives keep torch's default timeout here (600 s)",
            hint=("600",)),
    VerlKey("actor_rollout_ref.rollout.enable_prefix_caching", "vLLM's default is kept here: shared prompt prefixes "
            "are cached where the model supports it", hint=("true",)),
    VerlKey("actor_rollout_ref.rollout.logprobs_mode", "the engine's log-probs are those after temperature, top-k and "
            "top-p here", hint=("processed_logprobs",)),
    VerlKey("actor_rollout_ref.rollout.scheduling_policy", "vLLM serves requests first come, first served here",
            hint=("fcfs",)),
    VerlKey("actor_rollout_ref.rollout.disable_log_stats", "vLLM's engine statistics are not logged here", hint=True),
    VerlKey("actor_rollout_ref.rollout.skip_tokenizer_init", "the engine takes and returns token ids here either way",
            hint=True),
    VerlKey("actor_rollout_ref.rollout.calculate_log_probs", "the vLLM rollout always returns its log-probs here "
            "(rollout_log_probs)", hint=True),
    VerlKey("actor_rollout_ref.rollout.checkpoint_engine.backend", "weights reach the engines by this project's "
            "sync: in process, by CUDA IPC or by NCCL broadcast, as rollout.placement decides", hint=True),
    VerlKey("actor_rollout_ref.rollout.quantization*", "the engine runs the model unquantized here, in rollout.dtype",
            hint=("null", "none")),
    VerlKey("actor_rollout_ref.rollout.cudagraph_capture_sizes", "CUDA graphs are captured for decode batches up to "
            "rollout.cuda_graph_max_batch here", nearest="actor_rollout_ref.rollout.cuda_graph_max_batch",
            hint=("null", "none")),
    VerlKey("actor_rollout_ref.rollout.data_parallel_size", "each engine is one vLLM instance here; more engines "
            "come from rollout.num_engines", nearest="actor_rollout_ref.rollout.num_engines", hint=("1",)),
    VerlKey("actor_rollout_ref.rollout.expert_parallel_size", "the engine has no expert parallelism here", hint=("1",)),
    VerlKey("actor_rollout_ref.rollout.pipeline_model_parallel_size", "the engine splits the model by tensor "
            "parallelism only here", nearest="actor_rollout_ref.rollout.tensor_model_parallel_size", hint=("1",)),
    VerlKey("actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side", "tool output over "
            "multi_turn.tool_max_output_chars keeps its start here (verl's left)", hint=("left",)),
    VerlKey("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template", "the model's earlier turns stay as "
            "sampled in the conversation here (verl's false)", hint=("false",)),
    VerlKey("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode", "a warning check of verl's; here "
            "the chat template's rendering of tool messages is checked instead (an error)", hint=True),
    VerlKey("data.validation_shuffle", "validation prompts run in file order here", hint=("false",)),
    VerlKey("data.return_multi_modal_inputs", "each worker processes the pictures itself here (docs/vision.md)",
            hint=("true",)),
    VerlKey("data.image_patch_size", "the model's image processor sizes the pictures here (Qwen2-VL: 14-pixel "
            "patches)", hint=("14",)),
    VerlKey("critic.model.tokenizer_path", "the critic takes the actor's token ids and loads no tokenizer", hint=True),
    VerlKey("reward_model.strategy", "the reward model runs on FSDP2 here", hint=("fsdp", "fsdp2")),
    VerlKey("reward_model.ulysses_sequence_parallel_size", "the reward model runs without sequence parallelism here",
            hint=("1",)),
    VerlKey("reward_model.model.use_fused_kernels", "the reward model reads its score head; it computes no log-probs",
            hint=True),
    VerlKey("reward_model.use_reward_loop", "the driver's reward manager computes the rewards here "
            "(reward_model.reward_manager)", hint=True),
    VerlKey("reward_model.num_workers", "the driver's reward manager computes the rewards here", hint=True),
    VerlKey("reward_model.launch_reward_fn_async", "the driver computes the rewards after each generation here",
            hint=True),
    # verl settings with another name here, or none.
    VerlKey("actor_rollout_ref.actor.ppo_micro_batch_size", _MICRO_GLOBAL,
            nearest="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    VerlKey("actor_rollout_ref.rollout.log_prob_micro_batch_size", _MICRO_GLOBAL,
            nearest="actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
    VerlKey("actor_rollout_ref.ref.log_prob_micro_batch_size", _MICRO_GLOBAL,
            nearest="actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    VerlKey("critic.ppo_micro_batch_size", _MICRO_GLOBAL, nearest="critic.ppo_micro_batch_size_per_gpu"),
    VerlKey("critic.forward_micro_batch_size", _MICRO_GLOBAL, nearest="critic.forward_micro_batch_size_per_gpu"),
    VerlKey("reward_model.micro_batch_size", _MICRO_GLOBAL, nearest="reward_model.micro_batch_size_per_gpu"),
    VerlKey("*fsdp_config.model_dtype", "the model's dtype is one setting here",
            nearest="actor_rollout_ref.model.dtype"),
    VerlKey("*.optim.clip_grad", "gradient clipping is set on the role here",
            nearest="actor_rollout_ref.actor.grad_clip"),
    VerlKey("*.optim.warmup_style", "verl's deprecated name of the scheduler", nearest="optim.lr_scheduler_type"),
    VerlKey("*.model.external_lib", "no extra module is imported to register a model class here"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "model turns per conversation",
            nearest="actor_rollout_ref.rollout.multi_turn.max_turns"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.max_user_turns", "a conversation here ends on the model's turns",
            nearest="actor_rollout_ref.rollout.multi_turn.max_turns"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.tool_config_path", "tools here are Python functions listed as "
            "'path/to/file.py:function' (docs/agents.md)", nearest="actor_rollout_ref.rollout.multi_turn.tools"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.interaction_config_path", "a stateful environment class serves "
            "the tools and the reward here (docs/agents.md)",
            nearest="actor_rollout_ref.rollout.multi_turn.environment"),
    VerlKey("actor_rollout_ref.rollout.over_sample_rate", "every prompt's responses are generated whole here; "
            "no over-sampling"),
    VerlKey("actor_rollout_ref.rollout.agent.*", "the agent loop here is set by rollout.multi_turn (docs/agents.md)",
            nearest="actor_rollout_ref.rollout.multi_turn"),
    VerlKey("global_profiler.*", "no profiler is wired into the trainer; per-phase times and MFU are in the "
            "metrics (docs/operations.md)"),
    VerlKey("*.profiler.*", "no profiler is wired into the workers; per-phase times and MFU are in the metrics"),
    VerlKey("trainer.resume_from_path", "the resume folder is a value of trainer.resume_mode here",
            nearest="trainer.resume_mode"),
    VerlKey("trainer.default_hdfs_dir", "checkpoints go to a local or mounted folder only",
            nearest="trainer.default_local_dir", hint=("null", "none")),
    VerlKey("trainer.del_local_ckpt_after_load", "checkpoints are kept; trainer.max_ckpt_to_keep bounds them",
            nearest="trainer.max_ckpt_to_keep", hint=("false",)),
    VerlKey("trainer.rollout_data_dir", "generations are not dumped to files; trainer.log_val_generations logs "
            "validation samples", nearest="trainer.log_val_generations", hint=("null", "none")),
    VerlKey("trainer.validation_data_dir", "validation generations are not dumped to files",
            nearest="trainer.log_val_generations", hint=("null", "none")),
    VerlKey("ray_kwargs.ray_init.num_cpus", "the local Ray cluster's CPUs", nearest="trainer.ray_num_cpus"),
    VerlKey("ray_kwargs.*", "the trainer starts or joins Ray itself (RAY_ADDRESS, trainer.ray_num_cpus)"),
    VerlKey("data.reward_fn_key", "the scorer is chosen by the data_source column here", hint=("data_source",)),
    VerlKey("*megatron.use_mbridge", "Megatron workers convert the Hugging Face weights themselves here (to load, "
            "to sync the engine, to export)", hint=True),
    VerlKey("*megatron.vanilla_mbridge", "Megatron workers convert the Hugging Face weights themselves here",
            hint=True),
    VerlKey("*megatron.virtual_pipeline_model_parallel_size", "each pipeline stage holds one chunk of layers here "
            "(no interleaved schedule)", hint=("null", "none", "1")),
    VerlKey("*megatron.context_parallel_size", "a sequence is split over ranks only by sequence parallelism (TP) "
            "here; no context parallelism", hint=("1",)),
    VerlKey("*megatron.use_dist_checkpointing", "Megatron workers load the Hugging Face weights here", hint=("false",)),
    VerlKey("*megatron.dist_checkpointing_path", "Megatron workers load the Hugging Face weights here",
            hint=("null", "none")),
    # recompute_granularity=full is model.enable_gradient_checkpointing=true here (VERL_EQUIVALENTS).
    VerlKey("*megatron.override_transformer_config.recompute_method", _MEGATRON_RECOMPUTE,
            nearest="actor_rollout_ref.model.enable_gradient_checkpointing", hint=("uniform", "null", "none")),
    VerlKey("*megatron.override_transformer_config.recompute_num_layers", _MEGATRON_RECOMPUTE,
            nearest="actor_rollout_ref.model.enable_gradient_checkpointing", hint=("1", "null", "none")),
    VerlKey("*megatron.override_transformer_config.recompute_modules", "only whole layers are recomputed here",
            nearest="actor_rollout_ref.model.enable_gradient_checkpointing", hint=True),
    VerlKey("*megatron.override_transformer_config.recompute_*", _MEGATRON_RECOMPUTE,
            nearest="actor_rollout_ref.model.enable_gradient_checkpointing"),
    *(VerlKey(f"*megatron.override_transformer_config.{name}", _MEGATRON_KERNELS, hint=True)
      for name in MEGATRON_KERNEL_KEYS),
    VerlKey("*megatron.override_transformer_config.deallocate_pipeline_outputs", "pipeline stages keep the outputs "
            "they sent until the backward here (megatron-core's default; results are the same)", hint=True),
    VerlKey("actor_rollout_ref.ref.megatron.override_transformer_config.*", "the reference runs with the actor's "
            "transformer config", nearest="actor_rollout_ref.actor.megatron.override_transformer_config"),
    VerlKey("*megatron.override_transformer_config.*", "Megatron's transformer config comes from the Hugging Face "
            "config here; of its override keys only the routers' (moe_aux_loss_coeff, moe_z_loss_coeff, "
            "moe_router_load_balancing_type, moe_router_dtype), recomputation and kernel settings are taken"),
    # Copies and other names of this project's keys.
    VerlKey("*.rollout_n", "verl's copy of the responses per prompt", nearest="actor_rollout_ref.rollout.n"),
    VerlKey("actor_rollout_ref.rollout.prompt_length", "verl's copy of the prompt limit",
            nearest="data.max_prompt_length"),
    VerlKey("actor_rollout_ref.actor.use_remove_padding", "verl's copy of the model's setting",
            nearest="actor_rollout_ref.model.use_remove_padding"),
    VerlKey("actor_rollout_ref.actor.clip_ratio", "verl's value for clip bounds left null; both bounds are set here "
            "(clip_ratio_low, clip_ratio_high)", nearest="actor_rollout_ref.actor.clip_ratio_low"),
    VerlKey("actor_rollout_ref.ref.strategy", "the reference runs in the actor's processes, on its backend",
            nearest="actor_rollout_ref.actor.strategy"),
    VerlKey("*.data_loader_seed", "the mini-batch shuffles are seeded from the run's seed", nearest="trainer.seed"),
    VerlKey("*fsdp_config.seed", "every seed comes from the run's seed here", nearest="trainer.seed"),
    VerlKey("*megatron.seed", "every seed comes from the run's seed here", nearest="trainer.seed"),
    VerlKey("actor_rollout_ref.*.fsdp_config.ulysses_sequence_parallel_size", "the sequence-parallel size is a "
            "role key here", nearest="actor_rollout_ref.actor.ulysses_sequence_parallel_size"),
    VerlKey("critic.model.fsdp_config.ulysses_sequence_parallel_size", "the sequence-parallel size is a role key "
            "here", nearest="critic.ulysses_sequence_parallel_size"),
    VerlKey("actor_rollout_ref.*.fsdp_config.dtype", "the compute dtype is the model's setting here",
            nearest="actor_rollout_ref.model.dtype"),
    VerlKey("critic.model.fsdp_config.dtype", "the compute dtype is the model's setting here",
            nearest="critic.model.dtype"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.max_tool_response_length", "tool output is cut at this many "
            "characters", nearest="actor_rollout_ref.rollout.multi_turn.tool_max_output_chars"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", "responses per prompt",
            nearest="actor_rollout_ref.rollout.n", hint=("null", "none")),
    VerlKey("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", "the weight-sync bucket "
            "size", nearest="actor_rollout_ref.rollout.weight_sync_bucket_mb"),
    VerlKey("*.model.tokenizer_path", "the tokenizer is the model folder's", nearest="actor_rollout_ref.model.path",
            hint=("null", "none")),
    VerlKey("*.model.hf_config_path", "the model config is the model folder's config.json", hint=("null", "none")),
    VerlKey("data.tokenizer", "the tokenizer is the actor's model folder's", nearest="actor_rollout_ref.model.path",
            hint=("null", "none")),
    VerlKey("data.tool_config_path", "verl's copy of the tool config; tools here are 'file.py:function' entries",
            nearest="actor_rollout_ref.rollout.multi_turn.tools", hint=("null", "none")),
    VerlKey("data.return_full_prompt", "the batch carries token ids and the chat messages, no templated text",
            nearest="data.return_raw_chat", hint=("false",)),
    VerlKey("reward_manager.name", "the reward manager", nearest="reward_model.reward_manager"),
    VerlKey("reward_manager.source", "the reward managers are built in here", nearest="reward_model.reward_manager",
            hint=("register",)),
    VerlKey("reward_manager.module.*", "no reward-manager class of yours is loaded here; a reward function is",
            nearest="custom_reward_function.path"),
    VerlKey("critic.enable", "the critic runs exactly when algorithm.adv_estimator=gae",
            nearest="algorithm.adv_estimator", hint=("null", "none")),
    VerlKey("reward_model.enable_resource_pool", "the reward model shares the trainer's pool; trainer.placement="
            "separate gives each role its own", nearest="trainer.placement", hint=("false",)),
    VerlKey("reward_model.n_gpus_per_node", "a reward-model pool has the trainer's size",
            nearest="trainer.n_gpus_per_node"),
    VerlKey("reward_model.nnodes", "a reward-model pool has the trainer's size", nearest="trainer.nnodes"),
    VerlKey("reward_model.reward_loop_*", "verl's reward-loop classes are not loaded; the rewards come from the "
            "reward manager", nearest="reward_model.reward_manager"),
    VerlKey("trainer.max_*_ckpt_to_keep", "one checkpoint holds every role here", nearest="trainer.max_ckpt_to_keep",
            hint=("null", "none")),
    VerlKey("trainer.val_only", "every run trains; validation runs before training and every trainer.test_freq "
            "steps", nearest="trainer.val_before_train", hint=("false",)),
    VerlKey("algorithm.rollout_correction.rollout_is", "token-level truncated importance sampling (verl's token)",
            nearest="actor_rollout_ref.rollout.tis_imp_ratio_cap", hint=("null", "none")),
    VerlKey("algorithm.rollout_correction.rollout_is_threshold", "the truncated importance weights' cap",
            nearest="actor_rollout_ref.rollout.tis_imp_ratio_cap"),
    VerlKey("algorithm.rollout_correction.*", "rejection sampling, bypass mode and normalized weights are not here",
            nearest="actor_rollout_ref.rollout.tis_imp_ratio_cap", hint=("null", "none", "false", "ppo_clip")),
    # Features this project does not have.
    VerlKey("actor_rollout_ref.actor.policy_loss.*_cov_*", "settings of verl's clip-cov and kl-cov losses, not here",
            nearest="actor_rollout_ref.actor.policy_loss.loss_mode"),
    VerlKey("actor_rollout_ref.actor.policy_loss.ppo_kl_coef", "a setting of verl's kl-cov loss, not here",
            nearest="actor_rollout_ref.actor.policy_loss.loss_mode"),
    VerlKey("actor_rollout_ref.actor.tau_*", "temperatures of verl's SAPO loss, not here",
            nearest="actor_rollout_ref.actor.policy_loss.loss_mode"),
    VerlKey("actor_rollout_ref.actor.*sum_pi_squared*", "an input of verl's optimal-token baseline, not here",
            hint=("false",)),
    VerlKey("actor_rollout_ref.actor.use_prefix_grouper", "a group's responses do not share one prompt forward here",
            hint=("false",)),
    VerlKey("actor_rollout_ref.actor.freeze_vision_tower", "the vision tower trains with the model here (LoRA leaves "
            "it out)", nearest="actor_rollout_ref.model.exclude_modules", hint=("false",)),
    VerlKey("*.model.enable_activation_offload", "activations are not offloaded here; gradient checkpointing saves "
            "their memory", hint=("false",)),
    VerlKey("*.model.tiled_mlp.*", "tiled MLP is not here; gradient checkpointing saves activation memory",
            hint=("false",)),
    VerlKey("*.model.custom_chat_template", "the chat template is the model folder's", hint=("null", "none")),
    VerlKey("actor_rollout_ref.model.lora_adapter_path", "LoRA starts from fresh adapters here (docs/lora.md)",
            nearest="actor_rollout_ref.model.lora_rank", hint=("null", "none")),
    VerlKey("critic.model.lora_rank", "LoRA trains the actor only here", hint=("0",)),
    VerlKey("critic.model.lora_alpha", "LoRA trains the actor only here"),
    VerlKey("critic.model.target_modules", "LoRA trains the actor only here"),
    VerlKey("actor_rollout_ref.model.mtp.*", "multi-token prediction (training or speculative decoding) is not here"),
    VerlKey("actor_rollout_ref.rollout.mtp", "multi-token prediction is not here", hint=("null", "none")),
    VerlKey("*.router_replay.record_file", "recorded expert choices travel in the batch here, not through files",
            hint=("null", "none")),
    VerlKey("*.router_replay.replay_file", "recorded expert choices travel in the batch here, not through files",
            hint=("null", "none")),
    VerlKey("actor_rollout_ref.ref.router_replay.mode", "the reference policy routes with its own routers here; the "
            "actor replays", nearest="actor_rollout_ref.actor.router_replay.mode", hint=("disabled", "null", "none")),
    VerlKey("actor_rollout_ref.rollout.multi_turn.max_parallel_calls", "every tool call of a turn runs here, each "
            "in its own thread"),
    VerlKey("actor_rollout_ref.rollout.trace.*", "rollout tracing (mlflow, weave) is not here"),
    VerlKey("*.prometheus.*", "no Prometheus export; the metrics go to trainer.logger's trackers",
            nearest="trainer.logger"),
    VerlKey("actor_rollout_ref.rollout.skip_rollout", "rollouts are never dumped to or replayed from files here",
            hint=("false",)),
    VerlKey("actor_rollout_ref.rollout.skip_dump_dir", "rollouts are never dumped to or replayed from files here"),
    VerlKey("data.*_max_samples", "every row of the data files is used here", hint=("-1",)),
    VerlKey("data.return_raw_input_ids", "the reward model scores the policy's token ids here", hint=("false",)),
    VerlKey("data.video_key", "videos are not read here; pictures are", nearest="data.image_key"),
    VerlKey("data.custom_cls.*", "the dataset class is fixed here (trainer/data/rl_dataset.py)", hint=("null", "none")),
    VerlKey("data.sampler.*", "prompts are drawn in a seeded shuffled order; no curriculum sampler",
            nearest="data.shuffle", hint=("null", "none")),
    VerlKey("data.datagen.*", "the data set is not extended during the run", hint=("null", "none")),
    VerlKey("reward_model.model.input_tokenizer", "the reward model scores the policy's token ids here, so it must "
            "share the policy's tokenizer"),
    VerlKey("reward_model.max_length", "the reward model reads prompt and response as generated, uncut",
            hint=("null", "none")),
    VerlKey("reward_model.model.fsdp_config.param_offload", "the reward model stays on the GPU here", hint=("false",)),
    VerlKey("reward_model.sandbox_fusion.*", "no code sandbox is wired in; a reward function of yours may call one",
            nearest="custom_reward_function.path"),
    VerlKey("reward_model.rollout.*", "a generative reward model served by an engine is not here; the reward model "
            "here is a sequence classifier"),
    VerlKey("algorithm.use_pf_ppo", "PF-PPO's reweighting is not here", hint=("false",)),
    VerlKey("algorithm.pf_ppo.*", "PF-PPO's reweighting is not here"),
    VerlKey("trainer.esi_redundant_time", "no checkpoint before a cluster's expiry (ESI) here",
            nearest="trainer.save_freq", hint=("0",)),
    VerlKey("transfer_queue.*", "verl's transfer queue is not here; batches go through the driver", hint=("false",)),
)

# verl values of keys this project has, with no such value here: why, and what to choose instead.
VERL_VALUES: dict[tuple[str, str], str] = {
    ("actor_rollout_ref.rollout.name", "sglang"): "SGLang is not a rollout engine here; vllm takes the same rollout "
    "keys (tensor_model_parallel_size, gpu_memory_utilization, n, ...)",
    ("trainer.device", "npu"): "Ascend NPUs are not supported; cuda or cpu",
}


# verl keys this project has, accepted at all their values, that change nothing here: a command or yaml that sets
# one gets a note once (a default run says nothing).
NO_EFFECT_KEYS: dict[str, str] = {
    "actor_rollout_ref.rollout.mode": "verl's sync | async picks nothing here: vLLM always batches continuously (a "
    "call's whole batch at once; multi-turn: each turn joins the running batch when its conversation is ready), HF "
    "generate takes whole batches; fully asynchronous training is rollout.async_training=true",
}


# verl keys at values that mean one of this project's settings: the command gets that setting (and a note saying so).
VERL_EQUIVALENTS: dict[tuple[str, str], str] = {
    ("actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity", "full"):
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
    ("critic.megatron.override_transformer_config.recompute_granularity", "full"):
        "critic.model.enable_gradient_checkpointing=true",
}


def find_verl_key(key: str) -> VerlKey | None:
    """The table entry of a dotted key, or None when the key is not one of verl's listed here."""
    return next((entry for entry in VERL_KEYS if fnmatch.fnmatchcase(key, entry.pattern)), None)
