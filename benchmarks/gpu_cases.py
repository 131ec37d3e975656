"""The GPU suite's cases (benchmarks/gpu_suite.py runs them): every GPU path a user can choose, each as the
commands a user types and what its run must show. Part `one` wants one GPU, part `two` two."""

from __future__ import annotations

from benchmarks.gpu_cases_examples import example_cases_one_gpu, example_cases_two_gpus
from benchmarks.suite_runner import Case, RunCheck

MAIN = ("-m", "trainer.main")
# Every training case except the README's own job: no validation, a logger that needs nothing, the run's folder
# in the case's folder.
QUIET = (
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.logger=[console,jsonl]",
    "trainer.default_local_dir=run",
)
# A fixed KV cache: vLLM then skips its start-up measurement of the GPU's free memory, which the cases beside it
# upset; a tenth of the GPU is what its start asks to be free.
VLLM = (
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.kv_cache_gib=2",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
)
VERIFY = ("actor_rollout_ref.rollout.verify_sync=true",)
OFFLOAD = (
    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
)
LORA = (
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.actor.optim.lr=5e-3",
)
LIGER = ("actor_rollout_ref.model.use_liger=true", "critic.model.use_liger=true")
ALWAYS = ("actor_rollout_ref.actor.old_log_prob_pass=always",)
TINY_MOE = "actor_rollout_ref.model.path=outputs/tiny_moe"
MOE = (TINY_MOE, "actor_rollout_ref.actor.router_aux_loss_coef=0.001")
ROUTING_REPLAY = (
    "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
    "actor_rollout_ref.actor.router_replay.mode=R3",
)
REPLAY_MISMATCH = ("router_replay/mismatch_log_prob", "router_replay/mismatch_update")
# The trainer's routers against the engine's choices, before the update moves the weights: a near tie now and then
# (0.28% on the tiny model in bf16); a table mapped to the wrong tokens disagrees on most routings.
ENGINE_ROUTERS_AGREE = (("router_replay/mismatch_log_prob", 0.05),)
# verl's megatron-core router keys (its Qwen3-MoE scripts' values) and the metrics they add.
VERL_ROUTER = tuple(f"+actor_rollout_ref.actor.megatron.override_transformer_config.{setting}" for setting in (
    "moe_aux_loss_coeff=0.01", "moe_z_loss_coeff=0.001", "moe_router_dtype=fp32"))
ROUTER_LOSSES = ("actor/router_aux_loss", "actor/router_z_loss")
PPO_FINITE = ("actor/pg_loss", "critic/vf_loss")
MEGATRON_OFFLOAD = tuple(
    f"actor_rollout_ref.actor.megatron.{key}=true" for key in ("param_offload", "grad_offload", "optimizer_offload")
)
MEGATRON_OFFLOAD_RUN = (
    "actor_rollout_ref.actor.strategy=megatron", *VLLM, *VERIFY, *MEGATRON_OFFLOAD, "trainer.save_freq=2",
    "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=600",
)
CRITIC_OFFLOAD = ("critic.model.fsdp_config.param_offload=true", "critic.model.fsdp_config.optimizer_offload=true")


def steps(count: int) -> str:
    return f"trainer.total_training_steps={count}"


def _train(*overrides: str) -> tuple[str, ...]:
    return (*MAIN, *QUIET, *overrides)


def _lora_case(name: str, shared: bool, offload: bool, always: bool, verify: bool, path: str) -> Case:
    overrides = [*VLLM, *LORA, f"actor_rollout_ref.rollout.share_base_weights={str(shared).lower()}", steps(12)]
    overrides += [*OFFLOAD] if offload else []
    overrides += [*ALWAYS] if always else []
    overrides += [*VERIFY] if verify else []
    return Case(name, "one", path, (_train(*overrides),), RunCheck(12, synced=verify, offloaded=offload))


def one_gpu_cases() -> list[Case]:
    # LoRA: base shared with the engine or not x actor offload on or off x old log-prob pass auto or always, in
    # four runs that hold every pair of those settings once (a two-level orthogonal array).
    lora = [
        _lora_case(
            "lora_vllm_ref_first",
            True,
            True,
            False,
            False,
            "LoRA, vLLM hybrid, base shared, offload, pass skipped: the reference is the actor's first forward",
        ),
        _lora_case(
            "lora_unshared", False, False, False, True, "LoRA, vLLM hybrid, base not shared, no offload, pass skipped"
        ),
        _lora_case(
            "lora_shared_always", True, False, True, True, "LoRA, vLLM hybrid, base shared, no offload, pass always"
        ),
        _lora_case(
            "lora_unshared_offload_always",
            False,
            True,
            True,
            False,
            "LoRA, vLLM hybrid, base not shared, offload, pass always",
        ),
    ]
    resume = ("trainer.save_freq=2", *VLLM, *VERIFY, "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")
    # Longest first (measured on an H200), so the cases running side by side end close together. The engine
    # examples size their vLLM engines by measuring the GPU's free memory, which a neighbour upsets: they run alone.
    return [
        Case(
            "checkpoint_resume",
            "one",
            "checkpoint saved at step 4 (optimizer offloaded), resumed to step 6, vLLM",
            (_train(*resume, steps(4)), _train(*resume, steps(6))),
            RunCheck(6, synced=True, resumed_after=4),
        ),
        lora[0],
        Case(
            "vllm_hybrid",
            "one",
            "vLLM hybrid engine (CUDA graphs, sleep mode), CUDA IPC sync verified",
            (_train(*VLLM, *VERIFY, steps(30)),),
            RunCheck(30, reward_rises_by=0.2, synced=True),
        ),
        Case(
            "moe_vllm_hybrid",
            "one",
            "the tiny mixture of experts (trainer/tiny_moe.py), router load-balancing loss, vLLM hybrid engine with "
            "its fused-MoE kernels, every sync of the experts verified",
            (_train(*MOE, *VLLM, *VERIFY, steps(30)),),
            RunCheck(30, finite=("actor/router_aux_loss",), reward_rises_by=0.2, synced=True),
        ),
        Case(
            "moe_lora_vllm_hybrid",
            "one",
            "LoRA r8 on every linear layer of the tiny mixture of experts, the fused experts too (vLLM splits their "
            "factors per expert), hybrid vLLM engine whose weights are the base (fused experts included), every sync "
            "of the adapter verified",
            (_train(TINY_MOE, *VLLM, *LORA, *VERIFY, steps(12)),),
            RunCheck(12, synced=True, first_step=(("lora/unshared_base_tensors", 0.0),)),
        ),
        Case(
            "moe_routing_replay",
            "one",
            "routing replay R3 on the tiny mixture of experts: vLLM returns the experts it routed each token to, the "
            "log-prob pass and every update replay them, every sync of the experts verified",
            (_train(TINY_MOE, *VLLM, *VERIFY, *ALWAYS, *ROUTING_REPLAY, steps(20)),),
            RunCheck(
                20, finite=("actor/pg_loss", *REPLAY_MISMATCH), reward_rises_by=0.2, synced=True,
                at_most=ENGINE_ROUTERS_AGREE,
            ),
        ),
        Case(
            "moe_agent_routing_replay",
            "one",
            "routing replay R3 in the multi-turn agent loop (the tool task) on the tiny mixture of experts: each of "
            "vLLM's turns returns the experts of the conversation so far; the log-prob pass and the updates replay "
            "them",
            (_train("task=tool_vault", TINY_MOE, *VLLM, *ALWAYS, *ROUTING_REPLAY, steps(10)),),
            RunCheck(10, finite=("actor/pg_loss", *REPLAY_MISMATCH), at_most=ENGINE_ROUTERS_AGREE),
        ),
        Case(
            "megatron_moe_vllm_hybrid",
            "one",
            "Megatron actor on the tiny mixture of experts (megatron-core's MoE layer: router, all-to-all token "
            "dispatcher, experts), vLLM hybrid engine, every sync of the experts verified; the routers train with "
            "verl's megatron-core load-balancing and z-losses and fp32 gating",
            (_train(TINY_MOE, "actor_rollout_ref.actor.strategy=megatron", *VLLM, *VERIFY, *VERL_ROUTER, steps(12)),),
            RunCheck(12, finite=("actor/pg_loss", *ROUTER_LOSSES), synced=True),
        ),
        Case(
            "megatron_moe_routing_replay",
            "one",
            "routing replay R3 on the Megatron actor (megatron-core's routers take the experts vLLM returned, in the "
            "log-prob pass and every update, and again in the backward of its recomputed layers), tiny mixture of "
            "experts, vLLM hybrid, every sync verified",
            (_train(TINY_MOE, "actor_rollout_ref.actor.strategy=megatron", *VLLM, *VERIFY, *ALWAYS, *ROUTING_REPLAY,
                    "actor_rollout_ref.model.enable_gradient_checkpointing=true", steps(12)),),
            RunCheck(12, finite=("actor/pg_loss", *REPLAY_MISMATCH), synced=True, at_most=ENGINE_ROUTERS_AGREE),
        ),
        Case(
            "megatron_agent",
            "one",
            "the multi-turn agent loop (the tool task) on the Megatron actor's hybrid vLLM engine: each rank's "
            "conversations run their turns and tool calls there, the Megatron update trains on them",
            (_train("task=tool_vault", "actor_rollout_ref.actor.strategy=megatron", *VLLM, *VERIFY, steps(8)),),
            RunCheck(8, synced=True),
        ),
        Case(
            "megatron_offload",
            "one",
            "verl's Megatron offload switches (weights, float32 gradient buffers, main weights and Adam state to the "
            "host while the hybrid vLLM engine generates; the reference outside its pass), the distributed "
            "optimizer, token-budget micro-batches; saved at step 4 and resumed to step 6, every sync verified",
            (_train(*MEGATRON_OFFLOAD_RUN, steps(4)), _train(*MEGATRON_OFFLOAD_RUN, steps(6))),
            RunCheck(6, synced=True, offloaded=True, resumed_after=4),
            timeout_s=420,  # two runs, each starting Ray, Megatron and the engine
        ),
        Case(
            "dapo",
            "one",
            "DAPO (dynamic sampling, clip-higher, overlong penalty), vLLM hybrid",
            (_train("algorithm=dapo", *VLLM, steps(10)),),
            RunCheck(10),
        ),
        *lora[1:],
        Case(
            "readme_default",
            "one",
            "the README's main job, no overrides (GPU count from the node, HF rollout)",
            (MAIN,),
            RunCheck(64, last_reward_at_least=0.9),  # one epoch of the synthetic task (trainer.total_epochs=1)
            timeout_s=240,
        ),
        Case(
            "full_offload",
            "one",
            "full fine-tune, actor parameters and optimizer offloaded, vLLM hybrid",
            (_train(*VLLM, *VERIFY, *OFFLOAD, steps(10)),),
            RunCheck(10, synced=True, offloaded=True),
        ),
        Case(
            "ppo_critic_offload",
            "one",
            "PPO, actor and critic parameters and optimizer offloaded, vLLM hybrid (the critic's state leaves "
            "while the actor and the engine compute)",
            (_train("algorithm=ppo", *VLLM, *OFFLOAD, *CRITIC_OFFLOAD, steps(10)),),
            RunCheck(10, finite=(*PPO_FINITE, "offload/values/d2h_gib", "offload/update_critic/h2d_gib"),
                     offloaded=True),
        ),
        Case(
            "hf_padded_checkpointing",
            "one",
            "HF rollout, padded forwards, gradient checkpointing",
            (
                _train(
                    "actor_rollout_ref.rollout.name=hf",
                    "actor_rollout_ref.model.use_remove_padding=false",
                    "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                    steps(30),
                ),
            ),
            RunCheck(30, reward_rises_by=0.2),
        ),
        Case(
            "image_task",
            "one",
            "the image task on the tiny vision-language model (task=visual_colors)",
            (_train("task=visual_colors", steps(10)),),
            RunCheck(10),
        ),
        Case(
            "ppo_critic",
            "one",
            "PPO with a critic (GAE), HF rollout, Liger's kernels in the actor, reference and critic",
            (_train("algorithm=ppo", *LIGER, steps(30)),),
            RunCheck(30, finite=PPO_FINITE, reward_rises_by=0.2),
        ),
        *example_cases_one_gpu(),
    ]


def two_gpu_cases() -> list[Case]:
    separate = (
        "actor_rollout_ref.rollout.placement=separate",
        "actor_rollout_ref.rollout.async_training=true",
        "trainer.n_gpus_per_node=1",
    )
    megatron = (
        "actor_rollout_ref.model.path=model_kv2",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    )
    return [
        Case(
            "fsdp_two_gpus",
            "two",
            "FSDP over both GPUs (n_gpus_per_node from the node), vLLM hybrid on each",
            (_train(*VLLM, *VERIFY, steps(20)),),
            RunCheck(20, reward_rises_by=0.2, synced=True),
        ),
        Case(
            "hybrid_sharding_two",
            "two",
            "hybrid sharding (fsdp_size=1): a whole copy on each GPU, gradient shards summed once per mini-batch",
            (_train(*VLLM, *VERIFY, "actor_rollout_ref.actor.fsdp_config.fsdp_size=1", steps(20)),),
            RunCheck(20, reward_rises_by=0.2, synced=True, first_step=(("actor/fsdp_shard_ranks", 1.0),)),
        ),
        Case(
            "hybrid_tp2",
            "two",
            "verl's layout: both FSDP ranks share one hybrid vLLM engine of tensor parallel 2, one shard in each",
            (_train(*VLLM, *VERIFY, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", steps(20)),),
            RunCheck(20, reward_rises_by=0.2, synced=True, first_step=(("rollout/engine_shards_in_trainers", 2.0),)),
        ),
        Case(
            "lora_shared_tp2",
            "two",
            "LoRA, its frozen base shared with a TP2 hybrid engine held one shard per rank (o_proj and down_proj "
            "sharded on their input); the tiny vocabulary is split otherwise by vLLM and stays the trainer's",
            (_train(*VLLM, *LORA, *VERIFY, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", steps(12)),),
            RunCheck(
                12, synced=True,
                first_step=(("rollout/engine_shards_in_trainers", 2.0), ("lora/unshared_base_tensors", 1.0)),
            ),
        ),
        Case(
            "ulysses_two",
            "two",
            "PPO with Ulysses sequence parallel k=2 (actor, reference, critic)",
            (
                _train(
                    "algorithm=ppo",
                    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                    "critic.ulysses_sequence_parallel_size=2",
                    steps(10),
                ),
            ),
            RunCheck(10, finite=PPO_FINITE),
        ),
        Case(
            "separate_async_nccl",
            "two",
            "vLLM engine on its own GPU, NCCL broadcast, rollout.async_training=true",
            (_train(*VLLM, *VERIFY, *separate, steps(12)),),
            RunCheck(12, synced=True),
        ),
        Case(
            "moe_async_routing_replay",
            "two",
            "routing replay R3 with rollout.async_training=true on the tiny mixture of experts: the separate vLLM "
            "engine streams each response and hands its experts over with the finished request (a response resumed "
            "after a weight update covers its earlier tokens too), every sync verified",
            (_train(TINY_MOE, *VLLM, *VERIFY, *separate, *ROUTING_REPLAY, steps(12)),),
            RunCheck(12, finite=("actor/pg_loss", "router_replay/mismatch_update"), synced=True),
        ),
        Case(
            "megatron_tp2",
            "two",
            "Megatron actor, tensor parallel 2, vLLM hybrid (tiny model with 2 KV heads)",
            (
                ("-m", "trainer.tiny_model", "model_kv2", "--kv-heads", "2"),
                _train(*VLLM, *VERIFY, *megatron, steps(10)),
            ),
            RunCheck(10, synced=True),
        ),
        Case(
            "megatron_moe_ep2",
            "two",
            "Megatron actor on the tiny mixture of experts, expert parallel 2 (each GPU holds half of every layer's "
            "experts; NCCL all-to-all token dispatch), vLLM hybrid on each GPU, every sync of the experts verified",
            (
                _train(
                    TINY_MOE,
                    *VLLM,
                    *VERIFY,
                    "actor_rollout_ref.actor.strategy=megatron",
                    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
                    steps(10),
                ),
            ),
            RunCheck(10, synced=True),
        ),
        Case(
            "megatron_moe_folded",
            "two",
            "Megatron actor on the tiny mixture of experts (2 KV heads) with verl's parallel folding: attention over "
            "TP 2 (sequence parallel), whole experts over EP 2 (expert TP 1) on the same two GPUs, vLLM hybrid, every "
            "sync of the experts verified; the routers' losses (verl's keys) under sequence parallelism",
            (
                ("-m", "trainer.tiny_moe", "moe_kv2", "--kv-heads", "2"),
                _train(
                    "actor_rollout_ref.model.path=moe_kv2",
                    *VLLM,
                    *VERIFY,
                    "actor_rollout_ref.actor.strategy=megatron",
                    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                    "actor_rollout_ref.actor.megatron.sequence_parallel=true",
                    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
                    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
                    *VERL_ROUTER,
                    steps(10),
                ),
            ),
            RunCheck(10, finite=("actor/pg_loss", *ROUTER_LOSSES), synced=True),
        ),
        *example_cases_two_gpus(),
    ]


def cases(part: str) -> list[Case]:
    chosen = {"one": one_gpu_cases, "two": two_gpu_cases}
    return [case for name, build in chosen.items() if part in (name, "all") for case in build()]
