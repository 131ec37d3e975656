"""The memory plan: for each group of GPUs (the trainer pool, the rollout engines' pool, a role's own pool
with trainer.placement=separate), the peak bytes on one GPU in each phase of a step, split by kind.

Each phase's row is its peak moment: what is resident then (the models' state, minus what the config
offloads to the host), plus that moment's compute memory. Phases and residency follow the workers
(workers/fsdp/residency.py): with param_offload the actor's parameters come to the GPU for each phase that
computes with the actor and stay until another tenant of the process claims it (offload_residency.py
`actor_residency`, the one place that says which phases have them); with optimizer_offload its optimizer state is
on the GPU inside the optimizer step only; an offloading reference comes in for its log-probs; the critic's own
param_offload /
optimizer_offload follow the actor's rule (`critic_residency`); the reward model never offloads; a hybrid
vLLM engine holds its share (`engine_bytes`: `gpu_memory_utilization` x the GPU, or with
`rollout.kv_cache_gib` its weights, that KV cache and an allowance) while awake (generate) and nothing while
asleep.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.memory_plan.engine_profile import SLEEPING_ENGINE_BYTES, engine_overhead_bytes
from trainer.memory_plan.offload_residency import actor_residency, critic_residency
from trainer.memory_plan.residency import RoleMemory, role_memory
from trainer.memory_plan.setup import Batching, ModelRole, PlanSetup
from trainer.memory_plan.shape import engine_lora_params
from trainer.memory_plan.terms import (
    Trainability,
    backward_peak_bytes,
    forward_peak_bytes,
    kv_cache_bytes,
    logits_bytes,
    model_saved_bytes,
)
from workers.cached_blocks_limit import CACHED_BLOCKS_LIMIT

COLUMNS = ("weights", "grads", "optimizer", "activations", "logits", "engine", "other")
# Per GPU process: CUDA context, cuBLAS/NCCL workspaces, allocator slack (an allowance, not computed).
RUNTIME_BYTES = 1 << 30
# A hybrid engine over k > 1 GPUs (rollout.tensor_model_parallel_size) held by the group's first rank
# (rollout.engine_process=true) computes in worker processes of its own, one per GPU, each with its CUDA context and
# NCCL communicators, outside the engine's budget and kept while it sleeps (an engine over one GPU, or one shard per
# trainer rank, runs inside the trainer's process). Measured at 7B, two H200s (2026-11-30): 3.6 GiB
# outside the trainer's allocator at the generate phase's end, 2.1 GiB above RUNTIME_BYTES + SLEEPING_ENGINE_BYTES.
ENGINE_WORKER_PROCESS_BYTES = 2 << 30
# A hybrid engine over k > 1 GPUs held as one shard per trainer rank (the default) brings into each trainer process
# what the layout above holds in processes of its own, outside the engine's budget: its tensor-parallel group's NCCL
# communicators (0.28 GiB each beyond a process's first, 1.42 GiB for the first, H200:
# benchmarks/nccl_comm_memory.py), its compiled kernels. An allowance: measured at 7B TP2 on two H200s (2026-11-30)
# 3.2-4.5 GiB above the plan without it in the reference and update phases, with the LoRA base shared and without
# (vLLM itself reports 0.03 GiB of non-torch memory and a 0.59 GiB graph pool per shard); not broken down further.
# (3.2-4.0 while the plan summed a no-grad pass's layer transient and logits; the reference rows gained the difference.)
ENGINE_SHARD_BYTES = 4 << 30
# State brought back from the host for a phase lands in new allocator segments beside what the phase's other
# allocations left: measured at 7B on an H200 (2026-11-27) 0.10-0.17 of the loaded bytes above the plan.
LOAD_SLACK = 0.12


@dataclass(frozen=True)
class Row:
    role: str
    phase: str
    moment: str
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass(frozen=True)
class GpuGroup:
    name: str
    gpus: int
    rows: tuple[Row, ...]

    @property
    def peak(self) -> Row:
        return max(self.rows, key=lambda row: row.total)


@dataclass
class MemoryPlan:
    groups: list[GpuGroup]
    gpu_bytes: int | None
    gpu_source: str
    problems: list[str] = field(default_factory=list)  # start-up conditions that fail regardless of the peak
    notes: list[str] = field(default_factory=list)
    # What a run prints as warnings although the plan fits: a generation slowed by an engine's short KV cache.
    warnings: list[str] = field(default_factory=list)
    settings_on: set[str] = field(default_factory=set)  # remedies not suggested: already in use, or not applicable

    def peak(self) -> tuple[GpuGroup, Row]:
        group = max(self.groups, key=lambda g: g.peak.total)
        return group, group.peak

    def fits(self) -> bool | None:
        """None when the GPU's memory is unknown."""
        if self.gpu_bytes is None:
            return None
        return not self.problems and self.peak()[1].total <= self.gpu_bytes

    def row(self, phase: str) -> Row | None:
        """The highest row of `phase` over the groups (None when no group runs it)."""
        rows = [r for g in self.groups for r in g.rows if r.phase == phase]
        return max(rows, key=lambda r: r.total) if rows else None


def engine_weight_bytes(setup: PlanSetup) -> int:
    """A vLLM engine's weights on one of its GPUs: the actor's model in the engine's dtype, with its LoRA adapter
    slots (vLLM's rank) when the actor trains LoRA, split over the engine's tensor-parallel ranks."""
    actor = setup.actor
    params = actor.shape.total_params()
    if actor.train is not None and actor.train.lora_rank:
        params += engine_lora_params(actor.shape, actor.train.lora_rank, actor.train.lora_targets)
    return setup.rollout.engine_e * params // setup.rollout.tp


def engine_bytes(setup: PlanSetup, gpu_bytes: int | None) -> int:
    """A vLLM engine's bytes on one of its GPUs while awake: with rollout.kv_cache_gib its weights, that KV cache
    and its start-up profile's peak and CUDA graphs (engine_profile.py); else its budget,
    `gpu_memory_utilization` x the GPU, which its KV cache fills (0 while the GPU's memory is unknown)."""
    rollout = setup.rollout
    if rollout.kv_cache_bytes is not None:
        return engine_weight_bytes(setup) + rollout.kv_cache_bytes + engine_overhead_bytes(setup, gpu_bytes)
    return int(rollout.gpu_memory_utilization * gpu_bytes) if gpu_bytes else 0


def _parts(**values: int) -> dict[str, int]:
    return {column: int(values.get(column, 0)) for column in COLUMNS}


class _TrainerGpu:
    """One GPU of a trainer pool and the models on it."""

    def __init__(self, setup: PlanSetup, roles: list[ModelRole], engine: int, broadcast_staging: int) -> None:
        self.setup = setup
        self.roles = {role.name: role for role in roles}
        self.actor_in = actor_residency(setup, set(self.roles))  # the actor's parameters on the GPU, per phase
        self.critic_in = critic_residency(setup, set(self.roles))  # the critic's, likewise
        self.memory: dict[str, RoleMemory] = {r.name: role_memory(r, setup.gpus_per_pool) for r in roles}
        self.engine = engine  # a hybrid engine's bytes while awake (0: none here)
        self.staging = broadcast_staging
        # LoRA base shared with the hybrid engine: the actor's base shards are views of the engine's weights,
        # which stay on the GPU while the engine sleeps (its whole model: tensor parallel size 1), with the
        # engine's adapter slots (vLLM's rank, in the engine's dtype).
        actor = self.roles.get("actor")
        shares = setup.rollout.shares_base and setup.on_gpu and actor is not None and actor.train is not None
        self.shared_base = self.memory["actor"].frozen_base if shares else 0
        self.engine_weights = engine_weight_bytes(setup) if shares else 0

    def has(self, name: str) -> bool:
        return name in self.roles

    def _cached_blocks(self, name: str) -> int:
        """Free allocator blocks a computing FSDP worker keeps on its GPU: between micro-batches it hands back only
        what passes CACHED_BLOCKS_LIMIT beyond its peak (workers/cached_blocks.py), so up to that much stays
        (measured at 7B LoRA on an H100: 0.7-2.6 GiB above the plan's compute rows without this term)."""
        return CACHED_BLOCKS_LIMIT if self.setup.on_gpu and self.roles[name].strategy == "fsdp" else 0

    def resident(self, actor_loaded: bool, with_optimizer: bool, engine_awake: bool, optimizer_state: bool = True,
                 loaded: tuple[str, ...] = (), engine_started: bool = True, stepping: str = "actor",
                 training: tuple[str, ...] = ()) -> dict[str, int]:
        """What sits on the GPU between computations; `optimizer_state` False before the first step
        (AdamW creates its moments lazily); `loaded` names other offloading roles brought in for the phase;
        `with_optimizer`: the offloaded optimizer state of role `stepping` is in, for its step; `training`: the
        Megatron roles whose offloaded gradient buffers are in (workers/megatron/offload.py: they leave with the
        weights and come back for an update only).
        A LoRA base shared with the engine is the engine's (under weights while it sleeps, inside its share
        while awake) once the engine has started, and never offloaded."""
        weights = grads = optimizer = 0
        for name, mem in self.memory.items():
            role = self.roles[name]
            offloaded = role.param_offload and not (actor_loaded if name == "actor" else name in loaded)
            own = mem.weights - (self.shared_base if name == "actor" and engine_started else 0)
            weights += 0 if offloaded else own
            if role.strategy == "megatron" and (name in training or not role.grad_offload):
                grads += mem.grads  # Megatron's gradient buffer lives as long as the model, unless offloaded
            optimizer_off = role.optimizer_offload and not (with_optimizer and name == stepping)
            optimizer += mem.optimizer if optimizer_state and not optimizer_off else 0
        engine_holds_budget = engine_awake or not self.setup.rollout.sleeps
        engine = self.engine if engine_holds_budget else 0
        other = RUNTIME_BYTES + self.staging
        rollout = self.setup.rollout
        if engine_started and self.engine and rollout.placement == "hybrid" and rollout.tp > 1:
            other += ENGINE_WORKER_PROCESS_BYTES if rollout.own_processes else ENGINE_SHARD_BYTES
        if engine_started and not engine_holds_budget:
            weights += self.engine_weights
            other += SLEEPING_ENGINE_BYTES if self.engine else 0
        return _parts(weights=weights, grads=grads, optimizer=optimizer, engine=engine, other=other)

    def during(self, phase: str, stepping: str | None = None, loaded: tuple[str, ...] = ()) -> dict[str, int]:
        """What sits on the GPU while `phase` of `STEP_PHASES` computes (the hybrid engine asleep), the actor's
        and the critic's parameters as `actor_residency` and `critic_residency` say; `stepping`: the role whose
        optimizer step this is (its offloaded optimizer state comes in)."""
        if self.critic_in[phase]:
            loaded = (*loaded, "critic")
        return self.resident(self.actor_in[phase], stepping is not None, engine_awake=False, loaded=loaded,
                             stepping=stepping or "actor", training=self._gradients_in(phase))

    def _gradients_in(self, phase: str) -> tuple[str, ...]:
        """Roles whose offloaded Megatron gradient buffers are on the GPU in `phase`: the role whose update it is
        (its first zero_grad brings them), and a critic on GPUs of its own (nothing claims them after that)."""
        training = {"update_actor": ("actor",), "update_critic": ("critic",)}.get(phase, ())
        return (*training, "critic") if "actor" not in self.roles else training

    def forward(self, name: str, batch: Batching, logits_use: str | None) -> dict[str, int]:
        """The compute memory of a no-grad pass of model `name`, by column: its compute copies (weights),
        activations or logits, and the free blocks its worker keeps cached (other). Without a backward, each
        layer's transient is freed before the head computes its logits, so only the larger of the two counts
        (on an H200, a 7B reference over 32 768 tokens peaked inside the MLP, its logits chunks well below)."""
        role = self.roles[name]
        parts = self._compute(name, batch, forward_peak_bytes(role.shape, role.e), logits_use)
        smaller = "logits" if parts["activations"] >= parts["logits"] else "activations"
        return {**parts, smaller: 0}

    def backward(self, name: str, batch: Batching, logits: bool) -> dict[str, int]:
        """The compute memory at the end of a training forward, by column: as `forward`, with the reduce
        buffers (grads) and the activations kept for backward."""
        role = self.roles[name]
        train = role.train or Trainability(full=True)
        layers = {"kept_layers": role.kept_layers, "liger": role.liger}
        per_token = model_saved_bytes(role.shape, role.e, role.checkpointing, train, **layers)
        per_token += backward_peak_bytes(role.shape, role.e, role.checkpointing, train, **layers)
        return self._compute(name, batch, per_token, "train" if logits else None, grads=self.memory[name].reduce)

    def _compute(self, name: str, batch: Batching, per_token: int, logits_use: str | None, grads: int = 0) -> dict:
        role = self.roles[name]
        tp = role.tp if role.strategy == "megatron" else 1
        shape = role.shape
        logits = logits_bytes(batch.response_tokens, shape.vocab, role.e, logits_use, role.logits_chunk_tokens,
                              shape.hidden) // tp if logits_use else 0
        return _parts(weights=self.memory[name].gathered, grads=grads, activations=batch.tokens * per_token // tp,
                      logits=logits, other=self._cached_blocks(name))


def _add(parts: dict[str, int], *more: dict[str, int], **extra: int) -> dict[str, int]:
    """`parts` plus, column by column, the `more` parts and the `extra` values."""
    return {column: parts[column] + sum(m[column] for m in more) + int(extra.get(column, 0)) for column in COLUMNS}


def _load_slack(gpu: _TrainerGpu, before: dict[str, int], after: dict[str, int]) -> int:
    """Allocator slack for the state a phase loads from the host (`after` minus `before`), on a GPU."""
    return int(LOAD_SLACK * max(0, sum(after.values()) - sum(before.values()))) if gpu.setup.on_gpu else 0


def _sync_transient(gpu: _TrainerGpu) -> int:
    """In-process sync: one bucket in the engine's dtype plus the float32 whole of the tensor being gathered."""
    mem, role = gpu.memory["actor"], gpu.roles["actor"]
    if role.train is not None and not role.train.full:  # LoRA: the adapter factors only
        return role.e * mem.synced_params
    bucket = min(gpu.setup.rollout.bucket_bytes, role.e * mem.synced_params)
    return max(bucket, mem.largest_tensor) + mem.largest_tensor * 4 // role.e


def _generate_row(gpu: _TrainerGpu) -> Row:
    setup, actor = gpu.setup, gpu.roles["actor"]
    rollout = setup.rollout
    base = gpu.resident(actor_loaded=True, with_optimizer=False, engine_awake=True)
    if rollout.name == "vllm" and rollout.placement == "hybrid":
        slack = _load_slack(gpu, gpu.resident(actor_loaded=False, with_optimizer=False, engine_awake=True), base)
        return Row("actor", "generate", "weight sync, engine awake", _add(base, other=_sync_transient(gpu) + slack))
    if rollout.name == "vllm":
        return Row("actor", "generate", "weight broadcast to the engines", _add(base, other=_sync_transient(gpu)))
    mem = gpu.memory["actor"]
    sequences, prompts = setup.rows_per_gpu, setup.rows_per_gpu * setup.prompt
    cache = kv_cache_bytes(actor.shape, actor.e, sequences, setup.prompt + setup.response)
    prefill = prompts * forward_peak_bytes(actor.shape, actor.e)
    replica = actor.e * actor.shape.total_params() if actor.strategy == "megatron" else mem.gathered
    return Row("actor", "generate", "HF generate: key/value cache + prefill",
               _add(base, weights=replica, activations=cache + prefill, logits=3 * 4 * sequences * actor.shape.vocab))


def _init_row(gpu: _TrainerGpu) -> Row:
    """The larger of two moments: every model just loaded (before any offload), and the engine started
    (the workers offload their models first, so offloaded weights are not under the engine's start)."""
    every_model = tuple(gpu.memory)
    loaded = Row("actor", "init", "models loaded", gpu.resident(
        True, False, False, optimizer_state=False, loaded=every_model, engine_started=False, training=every_model))
    if not gpu.engine:
        return loaded
    rollout = gpu.setup.rollout
    # With rollout.verify_sync the actor's weights are in while the engine starts (its first check reads them):
    # measured at 7B full fine-tuning on an H200, 105.8 GiB where the plan without them said 70.9.
    checked = rollout.verify_sync and rollout.name == "vllm" and rollout.placement == "hybrid"
    parts = gpu.resident(checked, False, True, optimizer_state=False)
    # A base to be shared stays on the GPU while the engine starts (its values are compared, then it goes). vLLM
    # sizes its KV cache within rollout.gpu_memory_utilization of the whole GPU, counting what the process already
    # holds there, so the base is inside the engine's budget (measured at 7B on an H200: 70.2 GiB with the base,
    # 70.9 without); a fixed KV cache (rollout.kv_cache_gib) does not shrink for it.
    if rollout.kv_cache_bytes is not None:
        parts = _add(parts, weights=gpu.shared_base)
    moment = "vLLM engine started, actor in (sync check)" if checked else "vLLM engine started"
    started = Row("actor", "init", moment, parts)
    return started if started.total >= loaded.total else loaded


def _trainer_rows(gpu: _TrainerGpu) -> list[Row]:
    setup = gpu.setup
    rows: list[Row] = []
    if gpu.has("actor"):
        rows.append(_init_row(gpu))
        rows.append(_generate_row(gpu))
    if gpu.has("actor") and setup.old_log_prob is not None:
        forward = gpu.forward("actor", setup.old_log_prob, "log_probs_and_entropy")
        rows.append(Row("actor", "old_log_prob", "log-probs + entropy", _add(gpu.during("old_log_prob"), forward)))
    if setup.lora_reference and gpu.has("actor"):
        forward = gpu.forward("actor", setup.ref_log_prob, "log_probs")
        rows.append(
            Row("actor", "ref_log_prob", "base model (adapters off)", _add(gpu.during("ref_log_prob"), forward))
        )
    elif gpu.has("ref"):
        resident = gpu.during("ref_log_prob", loaded=("ref",))
        slack = _load_slack(gpu, gpu.during("ref_log_prob"), resident)
        forward = gpu.forward("ref", setup.ref_log_prob, "log_probs")
        rows.append(Row("ref", "ref_log_prob", "log-probs", _add(resident, forward, other=slack)))
    if gpu.has("critic") and setup.critic_forward is not None and setup.critic_update is not None:
        forward = gpu.forward("critic", setup.critic_forward, None)
        rows.append(Row("critic", "values", "forward", _add(gpu.during("values"), forward)))
        rows.extend(_update_rows(gpu, "critic", "update_critic", setup.critic_update, logits=False))
    if gpu.has("reward_model") and setup.reward_forward is not None:
        forward = gpu.forward("reward_model", setup.reward_forward, None)
        rows.append(Row("reward_model", "reward_model", "forward", _add(gpu.during("reward_model"), forward)))
    if gpu.has("actor"):
        rows.extend(_update_rows(gpu, "actor", "update_actor", setup.update, logits=True))
    return rows


def _update_rows(gpu: _TrainerGpu, name: str, phase: str, batch: Batching, logits: bool) -> list[Row]:
    """The end of a training forward (activations and logits kept for backward, gradients of
    earlier micro-batches) and, where it is higher, the optimizer step (on CPU, foreach AdamW's temporary;
    fused AdamW on GPU makes none). With optimizer_offload the model's optimizer state is on the GPU inside
    its step only."""
    mem = gpu.memory[name]
    base = gpu.during(phase)
    stepping = gpu.during(phase, stepping=name)  # the model's optimizer state, for its own step
    grads = 0 if gpu.roles[name].strategy == "megatron" else mem.grads  # Megatron's buffer is already resident
    compute = gpu.backward(name, batch, logits)
    backward = _add(base, compute, grads=grads)
    temporary = 0 if gpu.setup.on_gpu and gpu.roles[name].strategy == "fsdp" else mem.step_temporary
    # The blocks the forward/backward left cached stay reserved through the step.
    step = _add(stepping, grads=grads, optimizer=temporary, other=_load_slack(gpu, base, stepping) + compute["other"])
    rows = [Row(name, phase, "forward/backward", backward)]
    if mem.root_reduce > mem.reduce:
        # FSDP reduces the root unit's gradients last in backward. Its buffers, larger than a layer's, cannot
        # reuse the blocks the layers freed, which stay cached until the micro-batch ends: they add to the
        # backward's peak (Qwen2.5-14B shape cut to 12 layers, one H200: the plan 13% under NVML's peak without).
        rows.append(Row(name, phase, "root gradient reduction", _add(backward, grads=mem.root_reduce)))
    if sum(step.values()) > max(row.total for row in rows):  # shown only where it is the phase's peak
        rows.append(Row(name, phase, "optimizer step", step))
    return rows


def build_groups(setup: PlanSetup, gpu_bytes: int | None) -> list[GpuGroup]:
    """The GPU groups of the run and their rows."""
    rollout = setup.rollout
    engine = engine_bytes(setup, gpu_bytes)
    # The engine's share on a trainer GPU: a hybrid engine, or a separate one sharing the GPU.
    hybrid = rollout.name == "vllm" and setup.on_gpu and (rollout.placement == "hybrid" or rollout.shares_trainer_gpu)
    separate = rollout.name == "vllm" and rollout.placement == "separate"
    staging = 0
    if separate:  # the broadcast sender's two staging buffers (rank 0), kept between syncs
        actor_mem = role_memory(setup.actor, setup.gpus_per_pool)
        staging = (
            2 * max(rollout.bucket_bytes, actor_mem.largest_tensor)
            if actor_mem.synced_params == setup.actor.shape.total_params()
            else 0
        )
    actor_roles = [setup.actor] + ([setup.ref] if setup.ref else [])
    others = [r for r in (setup.critic, setup.reward_model) if r is not None]
    n = setup.gpus_per_pool
    groups: list[GpuGroup] = []
    if setup.placement == "separate":
        groups.append(
            GpuGroup(
                "actor GPUs", n, tuple(_trainer_rows(_TrainerGpu(setup, actor_roles, engine if hybrid else 0, staging)))
            )
        )
        for role in others:
            groups.append(GpuGroup(f"{role.name} GPUs", n, tuple(_trainer_rows(_TrainerGpu(setup, [role], 0, 0)))))
    else:
        gpu = _TrainerGpu(setup, actor_roles + others, engine if hybrid else 0, staging)
        groups.append(GpuGroup("trainer GPUs", n, tuple(_trainer_rows(gpu))))
    if separate and not rollout.shares_trainer_gpu:
        gpus = rollout.num_engines * rollout.tp
        row = Row(
            "rollout", "rollout_generate", "engine (weights + KV cache)", _parts(engine=engine, other=RUNTIME_BYTES)
        )
        groups.append(GpuGroup("rollout GPUs", gpus, (row,)))
    return groups
