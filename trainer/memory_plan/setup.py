"""What the memory plan needs from the trainer's config: models, parallelism, offload, micro-batches.

Sequence lengths are taken at their maximum (data.max_prompt_length + data.max_response_length, every
response full length): the plan is an upper bound for a fit check, not a forecast of a typical step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.memory_plan.gpu import GIB
from trainer.memory_plan.shape import LINEAR_NAMES, ModelShape, lora_targets, read_shape
from trainer.memory_plan.terms import FP32, Trainability
from trainer.old_log_prob_pass import old_log_prob_pass_needed
from workers.checkpointed_layers import kept_layers
from workers.fsdp_shard_group import shard_group_size
from workers.lora.spec import tensor_parallel_sharing_problems
from workers.rl_math.names import DEFAULT_LOGITS_CHUNK_TOKENS

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    value = OmegaConf.select(cfg, key, default=default)
    return default if value is None else value


def dtype_bytes(name: str, on_gpu: bool) -> int:
    """Bytes per element of the compute dtype ("auto": bf16 on GPU, float32 on CPU, as the workers choose)."""
    if name == "auto":
        return 2 if on_gpu else FP32
    return _DTYPE_BYTES[name]


@dataclass(frozen=True)
class Batching:
    """Rows of the largest micro-batch of one pass, and the tokens of it on one GPU."""

    rows: int
    tokens: int  # prompt + response tokens through the layers on one GPU
    response_tokens: int  # tokens whose log-probs (logits) are computed on one GPU
    sequence_parallel: int = 1  # Ulysses: GPUs sharing the micro-batch's tokens

    @classmethod
    def of(
        cls, rows_per_group: int, micro_rows: int, dynamic: bool, budget: int, prompt: int, response: int,
        sequence_parallel: int = 1,
    ) -> "Batching":
        """Fixed micro-batches of `micro_rows` rows, or (dynamic) up to `budget` tokens per GPU, of the rows
        one data-parallel group holds; a micro-batch's tokens are split over the `sequence_parallel` GPUs of the
        group (its packed row in equal parts). A token-budget micro-batch, or one GPU's part of a micro-batch,
        may hold only response tokens (an upper bound)."""
        k = sequence_parallel
        if dynamic:
            rows = rows_per_group
            group_tokens = min(budget * k, rows * (prompt + response))
        else:
            rows = max(1, min(micro_rows, rows_per_group))
            group_tokens = rows * (prompt + response)
        tokens = math.ceil(group_tokens / k)
        return cls(rows=rows, tokens=tokens, response_tokens=min(tokens, rows * response), sequence_parallel=k)


@dataclass(frozen=True)
class ModelRole:
    """One model of the run as it sits on its GPUs."""

    name: str  # actor, ref, critic, reward_model
    shape: ModelShape
    head: str  # lm, value, score
    e: int  # compute dtype bytes
    strategy: str  # fsdp | megatron
    train: Trainability | None  # None: frozen
    checkpointing: bool = False
    param_offload: bool = False
    optimizer_offload: bool = False
    grad_offload: bool = False  # Megatron's float32 gradient buffers leave with the weights, return for its update
    tp: int = 1
    pp: int = 1
    ep: int = 1  # Megatron's expert parallel size: each layer's experts split over this many ranks
    etp: int | None = None  # Megatron's expert tensor parallel size: each expert split over this many (None: tp)
    distributed_optimizer: bool = False
    # The LM head's log-probs a chunk of this many tokens at a time (0: full logits; megatron: always full).
    logits_chunk_tokens: int = 0
    kept_layers: int = 0  # with checkpointing: the last decoder layers that keep their activations
    liger: bool = False  # model.use_liger: Liger's RMSNorm and SwiGLU keep less for backward
    fsdp_size: int = -1  # fsdp_config.fsdp_size: the ranks an FSDP model's shards spread over (-1: its whole pool)


@dataclass(frozen=True)
class RolloutSetup:
    name: str  # hf | vllm
    placement: str  # hybrid | separate
    gpu_memory_utilization: float
    sleeps: bool  # hybrid vLLM on GPU releases weights and KV cache between generations
    num_engines: int
    tp: int  # the GPUs one engine spans (a hybrid engine: those of the tp actor ranks sharing it)
    bucket_bytes: int
    # A separate engine on a fraction of a trainer's GPU (rollout.gpus_per_engine < 1): its budget counts on
    # that GPU, all the time (a separate engine never sleeps).
    shares_trainer_gpu: bool = False
    # LoRA's frozen base is views of the hybrid engine's weights (rollout.share_base_weights): one copy, which
    # the engine keeps through its sleep (only its KV cache is freed).
    shares_base: bool = False
    engine_e: int = 2  # the engine's dtype bytes (rollout.dtype; auto: the actor's compute dtype)
    # rollout.kv_cache_gib in bytes: a fixed KV cache per engine GPU (None: sized within gpu_memory_utilization;
    # always on CPU, where vLLM's cache is rollout.cpu_kv_cache_mb).
    kv_cache_bytes: int | None = None
    max_model_len: int = 0  # tokens of the longest sequence the engine serves (rollout.max_model_len)
    max_num_seqs: int | None = None  # rollout.max_num_seqs: sequences one engine step runs at most (None: vLLM's)
    max_num_batched_tokens: int | None = None  # rollout.max_num_batched_tokens: tokens one engine step runs at most
    # A hybrid engine of tp > 1 computes in worker processes of its own (rollout.engine_process=true), not as one
    # shard in each trainer process.
    own_processes: bool = False
    # rollout.verify_sync: a hybrid engine's first check fingerprints the actor's initial weights, so the actor is
    # brought to the GPU before the engine starts and stays there until the first generate.
    verify_sync: bool = False


@dataclass(frozen=True)
class PlanSetup:
    on_gpu: bool
    gpus_per_pool: int  # trainer.n_gpus_per_node x trainer.nnodes
    placement: str  # colocated | separate
    prompt: int
    response: int
    rows_per_gpu: int  # rollout rows each trainer GPU holds
    actor: ModelRole
    ref: ModelRole | None  # a separate reference model (None: none, or LoRA's base model serves as reference)
    lora_reference: bool  # the reference log-probs come from the actor's base (LoRA, adapters disabled)
    critic: ModelRole | None
    reward_model: ModelRole | None
    rollout: RolloutSetup
    update: Batching
    old_log_prob: Batching | None  # None: no separate pass, the update gives pi_old (trainer/old_log_prob_pass.py)
    ref_log_prob: Batching
    critic_forward: Batching | None
    critic_update: Batching | None
    reward_forward: Batching | None
    packed: bool


def _fsdp_size(fsdp_config: Any) -> int:
    """A role's `fsdp_config.fsdp_size` (-1 when unset)."""
    return int(fsdp_config.get("fsdp_size", -1))


def _kept_layers(model: DictConfig, shape: ModelShape) -> int:
    recompute = model.get("gradient_checkpointing_layers")
    return kept_layers(None if recompute is None else int(recompute), shape.layers)


def lora_trainability(model: DictConfig, shape: ModelShape | None = None) -> Trainability:
    """Full training, or LoRA adapters when the model section sets a lora_rank ("all-linear": the names `shape`
    has, `ModelShape.linear_names`)."""
    rank = int(model.get("lora_rank", 0) or 0)
    if rank <= 0:
        return Trainability(full=True)
    names = shape.linear_names() if shape is not None else LINEAR_NAMES
    targets = lora_targets(model.get("target_modules", "all-linear"), model.get("exclude_modules", None), names)
    return Trainability(full=False, lora_rank=rank, lora_targets=targets)


def _base_dtype(cfg: DictConfig, on_gpu: bool) -> str:
    """The actor's compute dtype (auto: bfloat16 on GPU, float32 on CPU)."""
    model = cfg.actor_rollout_ref.model
    return str(model.dtype) if str(model.dtype) != "auto" else ("bfloat16" if on_gpu else "float32")


def _engine_dtype(cfg: DictConfig, on_gpu: bool) -> str:
    """The vLLM engine's dtype: rollout.dtype, auto meaning the actor's compute dtype."""
    ro = cfg.actor_rollout_ref.rollout
    return _base_dtype(cfg, on_gpu) if str(ro.dtype) == "auto" else str(ro.dtype)


def _shares_base(cfg: DictConfig, train: Trainability, strategy: str, on_gpu: bool, experts: bool) -> bool:
    """The workers' rule (workers/fsdp/shared_base.py): null shares wherever LoRA runs on the FSDP actor with
    a hybrid vLLM engine of the base's dtype; a tensor-parallel engine by the workers' own tensor-parallel rule."""
    ro = cfg.actor_rollout_ref.rollout
    if _get(cfg, "actor_rollout_ref.rollout.share_base_weights", None) is False:
        return False
    return (train.lora_rank > 0 and strategy == "fsdp" and str(ro.name) == "vllm" and str(ro.placement) == "hybrid"
            and not _tensor_parallel_problems(cfg, experts)
            and _engine_dtype(cfg, on_gpu) == _base_dtype(cfg, on_gpu))


def _tensor_parallel_problems(cfg: DictConfig, experts: bool) -> list[str]:
    """workers.lora.spec's tensor-parallel sharing rule, given the actor's FSDP shard group over the run's ranks."""
    fsdp_size = int(_get(cfg, "actor_rollout_ref.actor.fsdp_config.fsdp_size", -1))
    ranks = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    section = OmegaConf.to_container(cfg.actor_rollout_ref, resolve=True)
    return tensor_parallel_sharing_problems(section, shard_ranks=shard_group_size(fsdp_size, ranks), experts=experts)


def _megatron(section: DictConfig) -> dict[str, Any]:
    mega = section.get("megatron") or {}
    return {
        "tp": int(mega.get("tensor_model_parallel_size", 1)),
        "pp": int(mega.get("pipeline_model_parallel_size", 1)),
        "ep": int(mega.get("expert_model_parallel_size") or 1),
        "etp": None if mega.get("expert_tensor_parallel_size") is None else int(mega["expert_tensor_parallel_size"]),
        "distributed_optimizer": bool(mega.get("use_distributed_optimizer", False)),
    }


def plan_setup(cfg: DictConfig, on_gpu: bool) -> PlanSetup:
    """Read the plan's inputs from a loaded trainer config; ValueError names a model folder without a config.json."""
    arr = cfg.actor_rollout_ref
    world = int(_get(cfg, "trainer.n_gpus_per_node", 1)) * int(_get(cfg, "trainer.nnodes", 1))
    prompt, response = int(cfg.data.max_prompt_length), int(cfg.data.max_response_length)
    n = int(arr.rollout.n)
    rows = max(1, -(-int(cfg.data.train_batch_size) * n // world))
    # Ulysses: the rows of a data-parallel group of k GPUs, whose micro-batches the k GPUs split.
    actor_sp = int(_get(cfg, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1))
    actor_rows = max(1, -(-int(cfg.data.train_batch_size) * n * actor_sp // world))
    mini_rows = max(1, int(arr.actor.ppo_mini_batch_size) * n * actor_sp // world)
    e = dtype_bytes(str(arr.model.dtype), on_gpu)
    strategy = str(_get(cfg, "actor_rollout_ref.actor.strategy", "fsdp"))
    actor_shape = read_shape(str(arr.model.path), "actor_rollout_ref.model.path", arr.model.get("override_config"))
    train = lora_trainability(arr.model, actor_shape) if strategy == "fsdp" else Trainability(full=True)
    fsdp_config = arr.actor.get("fsdp_config") or {}
    # The offload switches act on a GPU: verl's fsdp_config keys for FSDP, its megatron keys for Megatron.
    offload = (arr.actor.get("megatron") or {}) if strategy == "megatron" else fsdp_config
    parallel = _megatron(arr.actor) if strategy == "megatron" else {}
    # Megatron computes its vocabulary-parallel logits whole (workers/megatron/vocab_parallel.py).
    chunk = 0
    if strategy == "fsdp":
        chunk = int(_get(cfg, "actor_rollout_ref.model.logits_chunk_tokens", DEFAULT_LOGITS_CHUNK_TOKENS))
    actor = ModelRole(
        "actor", actor_shape, "lm", e, strategy, train,
        bool(arr.model.enable_gradient_checkpointing),  # Megatron: full recompute of every layer
        bool(offload.get("param_offload", False)) and on_gpu, bool(offload.get("optimizer_offload", False)) and on_gpu,
        bool(offload.get("grad_offload", False)) and on_gpu,
        **parallel,
        logits_chunk_tokens=chunk, kept_layers=_kept_layers(arr.model, actor_shape),
        liger=bool(_get(cfg, "actor_rollout_ref.model.use_liger", False)) and strategy == "fsdp",
        fsdp_size=_fsdp_size(fsdp_config),
    )
    uses_reference = bool(arr.actor.use_kl_loss) or bool(_get(cfg, "algorithm.use_kl_in_reward", False))
    lora_reference = uses_reference and train.lora_rank > 0
    ref_fsdp = arr.ref.get("fsdp_config") or {}
    ref_switches = (arr.ref.get("megatron") or {}) if strategy == "megatron" else ref_fsdp
    ref_offload = bool(ref_switches.get("param_offload", False)) and on_gpu
    ref = (
        ModelRole("ref", actor_shape, "lm", e, strategy, None, param_offload=ref_offload, logits_chunk_tokens=chunk,
                  fsdp_size=_fsdp_size(ref_fsdp), **parallel)
        if uses_reference and not lora_reference
        else None
    )
    critic = critic_update = critic_forward = None
    if str(_get(cfg, "algorithm.adv_estimator", "grpo")) == "gae":
        section = cfg.critic
        critic_e = dtype_bytes(str(section.model.dtype), on_gpu)
        critic_strategy = str(section.get("strategy", "fsdp"))
        critic_shape = read_shape(str(section.model.path), "critic.model.path", section.model.get("override_config"))
        # As the actor's: offload moves state on a GPU only, by the switches of the critic's strategy.
        critic_fsdp = section.model.get("fsdp_config") or {}
        critic_offload = (section.get("megatron") or {}) if critic_strategy == "megatron" else critic_fsdp
        critic = ModelRole(
            "critic", critic_shape, "value", critic_e, critic_strategy,
            Trainability(full=True), bool(section.model.enable_gradient_checkpointing),
            bool(critic_offload.get("param_offload", False)) and on_gpu,
            bool(critic_offload.get("optimizer_offload", False)) and on_gpu,
            bool(critic_offload.get("grad_offload", False)) and on_gpu,
            **(_megatron(section) if critic_strategy == "megatron" else {}),
            kept_layers=_kept_layers(section.model, critic_shape),
            liger=bool(_get(cfg, "critic.model.use_liger", False)) and critic_strategy == "fsdp",
            fsdp_size=_fsdp_size(critic_fsdp),
        )
        dynamic = bool(section.use_dynamic_bsz)
        critic_sp = int(_get(cfg, "critic.ulysses_sequence_parallel_size", 1))
        critic_rows = max(1, -(-int(cfg.data.train_batch_size) * n * critic_sp // world))
        critic_mini_rows = max(1, int(section.ppo_mini_batch_size) * n * critic_sp // world)
        critic_update = Batching.of(critic_mini_rows, int(section.ppo_micro_batch_size_per_gpu), dynamic,
                                    int(section.ppo_max_token_len_per_gpu), prompt, response, critic_sp)
        critic_forward = Batching.of(
            critic_rows, int(section.get("forward_micro_batch_size_per_gpu", 8)), dynamic,
            int(section.get("forward_max_token_len_per_gpu", 32768)), prompt, response, critic_sp,
        )
    reward_model = reward_forward = None
    rm = cfg.reward_model
    if bool(rm.enable) and rm.model.path:
        reward_model = ModelRole("reward_model", read_shape(str(rm.model.path), "reward_model.model.path"), "score",
                                 dtype_bytes(str(rm.model.dtype), on_gpu), "fsdp", None)
        reward_forward = Batching.of(rows, int(rm.micro_batch_size_per_gpu), bool(rm.use_dynamic_bsz),
                                     int(rm.forward_max_token_len_per_gpu), prompt, response)
    ro = arr.rollout
    shares = (
        str(ro.placement) == "separate" and float(_get(cfg, "actor_rollout_ref.rollout.gpus_per_engine", None) or 1) < 1
    )
    kv_cache_gib = _get(cfg, "actor_rollout_ref.rollout.kv_cache_gib", None)
    max_num_seqs = _get(cfg, "actor_rollout_ref.rollout.max_num_seqs", None)
    max_num_batched_tokens = _get(cfg, "actor_rollout_ref.rollout.max_num_batched_tokens", None)
    rollout = RolloutSetup(
        name=str(ro.name), placement=str(ro.placement), gpu_memory_utilization=float(ro.gpu_memory_utilization),
        sleeps=bool(ro.enable_sleep) and bool(ro.free_cache_engine) and on_gpu and not shares,
        num_engines=int(ro.num_engines), tp=int(ro.tensor_model_parallel_size),
        bucket_bytes=int(ro.weight_sync_bucket_mb) << 20, shares_trainer_gpu=shares,
        shares_base=_shares_base(cfg, train, strategy, on_gpu, experts=actor_shape.moe is not None),
        engine_e=dtype_bytes(_engine_dtype(cfg, on_gpu), on_gpu),
        kv_cache_bytes=int(float(kv_cache_gib) * GIB) if kv_cache_gib is not None and on_gpu else None,
        max_model_len=int(_get(cfg, "actor_rollout_ref.rollout.max_model_len", prompt + response)),
        max_num_seqs=int(max_num_seqs) if max_num_seqs is not None else None,
        max_num_batched_tokens=int(max_num_batched_tokens) if max_num_batched_tokens is not None else None,
        own_processes=bool(_get(cfg, "actor_rollout_ref.rollout.engine_process", None)),
        verify_sync=bool(_get(cfg, "actor_rollout_ref.rollout.verify_sync", False)),
    )
    log_dynamic = bool(ro.log_prob_use_dynamic_bsz)
    return PlanSetup(
        on_gpu=on_gpu, gpus_per_pool=world, placement=str(_get(cfg, "trainer.placement", "colocated")), prompt=prompt,
        response=response, rows_per_gpu=rows, actor=actor, ref=ref, lora_reference=lora_reference, critic=critic,
        reward_model=reward_model, rollout=rollout,
        update=Batching.of(mini_rows, int(arr.actor.ppo_micro_batch_size_per_gpu), bool(arr.actor.use_dynamic_bsz),
                           int(arr.actor.ppo_max_token_len_per_gpu), prompt, response, actor_sp),
        old_log_prob=Batching.of(actor_rows, int(ro.log_prob_micro_batch_size_per_gpu), log_dynamic,
                                 int(ro.log_prob_max_token_len_per_gpu), prompt, response, actor_sp)
        if old_log_prob_pass_needed(cfg) else None,
        ref_log_prob=Batching.of(
            actor_rows, int(arr.ref.log_prob_micro_batch_size_per_gpu), bool(arr.ref.log_prob_use_dynamic_bsz),
            int(arr.ref.log_prob_max_token_len_per_gpu), prompt, response, actor_sp,
        ),
        critic_forward=critic_forward, critic_update=critic_update, reward_forward=reward_forward,
        packed=arr.model.use_remove_padding is not False and strategy == "fsdp",
    )
