"""Per-GPU bytes of one model's state (weights, gradients, optimizer) and of its compute-time copies, as the
FSDP2 and Megatron workers hold them.

FSDP2 (workers/fsdp/model_loading.py, optim.py): a trainable model keeps float32 master weights sharded over
the pool, float32 gradients and AdamW's two float32 moments; on CPU `optimizer.step()` (foreach AdamW)
makes one float32 temporary of the moments' size (on GPU the fused AdamW makes none). A frozen model
(reference, reward model) is stored in the compute dtype. With LoRA the base is frozen in the compute dtype
and only the float32 adapter factors train.
In a forward/backward FSDP2 holds unsharded compute-dtype copies of the root unit (embedding, final norm,
head) and of the layer being computed plus the one prefetched; backward reduces one layer's gradients at a
time (its compute-dtype gradients, a float32 copy and the float32 shard), and the root unit's last, at the
root's own size (its compute-dtype gradients are freed once copied into the float32 input).
Megatron (workers/megatron/backend.py): compute-dtype weights (Float16Module), a float32 gradient buffer and
float32 main weights + moments (sharded over data-parallel ranks with the distributed optimizer), per
tensor x pipeline parallel slice.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.memory_plan.setup import ModelRole
from trainer.memory_plan.shape import lora_params
from trainer.memory_plan.terms import FP32
from workers.megatron.vocab_padding import padded_vocab_size

ADAM_MOMENTS = 2 * FP32


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class RoleMemory:
    """Bytes on each GPU of the role's pool."""

    weights: int  # parameter shards as stored
    grads: int  # sharded gradients (after a backward; freed after each optimizer step)
    optimizer: int  # optimizer state (after the first step)
    step_temporary: int  # foreach AdamW's temporary during optimizer.step() (CPU; the fused GPU step has none)
    gathered: int  # compute copies alive during a forward/backward (FSDP2 unsharded units)
    reduce: int  # one layer's gradient reduction buffers during backward
    root_reduce: int  # the root unit's (embedding, final norm, head) reduction buffers, at the end of backward
    largest_tensor: int  # bytes of the largest whole parameter in the compute dtype (a weight-sync slot)
    synced_params: int  # parameters a weight sync sends (the adapters only, with LoRA)
    frozen_base: int = 0  # LoRA: the frozen base shards (part of `weights`), which a hybrid engine can hold instead


def role_memory(role: ModelRole, gpus: int) -> RoleMemory:
    """One GPU's share of `role` over a pool of `gpus` (an FSDP model with hybrid sharding: over its shard group)."""
    shape, e = role.shape, role.e
    if role.strategy == "fsdp" and 0 < role.fsdp_size < gpus:
        gpus = role.fsdp_size
    total = shape.total_params(role.head)
    layer, root = shape.layer_params(), shape.root_params(role.head)
    largest = e * shape.largest_tensor()
    if role.strategy == "megatron":
        return _megatron_memory(role, gpus, largest)
    if role.train is None:  # frozen, stored in the compute dtype
        return RoleMemory(e * _ceil_div(total, gpus), 0, 0, 0, e * (root + 2 * layer), 0, 0, largest, total)
    if role.train.full:
        local = _ceil_div(total, gpus)
        # The root's float32 reduce-scatter input, beside first its compute-dtype gradients (freed once copied
        # in) and then the float32 output: the larger pair is the peak (a CUDA memory trace at the 14B shape).
        root_reduce = (FP32 + max(e, _ceil_div(FP32, gpus))) * root
        return RoleMemory(
            weights=FP32 * local, grads=FP32 * local, optimizer=ADAM_MOMENTS * local, step_temporary=FP32 * local,
            gathered=e * (root + 2 * layer), reduce=(e + FP32 + _ceil_div(FP32, gpus)) * layer, root_reduce=root_reduce,
            largest_tensor=largest, synced_params=total,
        )
    adapters = lora_params(shape, role.train.lora_rank, role.train.lora_targets)
    local_adapters = _ceil_div(adapters, gpus)
    layer_adapters = adapters // max(shape.layers, 1)
    return RoleMemory(
        weights=e * _ceil_div(total, gpus) + FP32 * local_adapters, grads=FP32 * local_adapters,
        optimizer=ADAM_MOMENTS * local_adapters, step_temporary=FP32 * local_adapters,
        gathered=e * (root + 2 * (layer + layer_adapters)), reduce=(e + FP32 + _ceil_div(FP32, gpus)) * layer_adapters,
        root_reduce=0, largest_tensor=largest, synced_params=adapters, frozen_base=e * _ceil_div(total, gpus),
    )


def megatron_stage_params(role: ModelRole) -> int:
    """Parameters of the largest pipeline stage (layers split evenly; the embedding on the first stage, the
    head, or with tied embeddings a copy of the embedding, on the last), the vocabulary padded as Megatron pads it."""
    shape = role.shape
    embedding = padded_vocab_size(shape.vocab, role.tp) * shape.hidden
    head = shape.head_params(role.head)
    head = embedding if role.head == "lm" and head else head  # an untied LM head has the padded rows too
    layers = _ceil_div(shape.layers, role.pp) * shape.layer_params()
    if role.pp == 1:
        return layers + embedding + shape.hidden + head
    return layers + max(embedding, (head or embedding) + shape.hidden)


def megatron_replicated_params(role: ModelRole) -> int:
    """Parameters of the largest stage that every tensor-parallel rank holds whole: the RMSNorms (Qwen3's per-head
    q/k norms too) and the routers."""
    shape = role.shape
    layers = range(_ceil_div(shape.layers, role.pp))
    norms = 2 * shape.hidden + 2 * shape.head_dim * shape.qk_norm
    routers = sum(shape.moe.router_params(shape.hidden) for layer in layers if shape.sparse(layer)) if shape.moe else 0
    return len(layers) * norms + routers + shape.hidden  # the final norm (last stage)


def megatron_stage_experts(role: ModelRole) -> int:
    """Expert parameters of the largest pipeline stage (part of `megatron_stage_params`)."""
    moe, shape = role.shape.moe, role.shape
    if moe is None:
        return 0
    sparse_layers = sum(1 for layer in range(shape.layers) if shape.sparse(layer))
    return _ceil_div(sparse_layers, role.pp) * moe.experts_params(shape.hidden)


def _megatron_memory(role: ModelRole, gpus: int, largest: int) -> RoleMemory:
    """Dense parameters split over TP; experts over expert TP x EP (expert TP is the TP size unless set:
    workers/megatron/moe.py). The distributed optimizer shards the dense state over the data-parallel ranks and the
    experts' over the expert-data-parallel ones (a stage's TP x DP ranks / (expert TP x EP))."""
    e = role.e
    expert_tp = role.tp if role.etp is None else role.etp
    stage, experts, whole = megatron_stage_params(role), megatron_stage_experts(role), megatron_replicated_params(role)
    dense_local = _ceil_div(stage - experts - whole, role.tp) + whole
    expert_local = _ceil_div(experts, expert_tp * role.ep)
    local = dense_local + expert_local
    if role.train is None:
        return RoleMemory(e * local, 0, 0, 0, 0, 0, 0, largest, role.shape.total_params(role.head))
    dp = max(1, gpus // (role.tp * role.pp))
    dense_shards = dp if role.distributed_optimizer else 1
    expert_shards = max(1, role.tp * dp // (expert_tp * role.ep)) if role.distributed_optimizer else 1
    main_weights = FP32 if e < FP32 else 0  # the mixed-precision optimizer's float32 copy

    def sharded(per_param: int) -> int:
        return _ceil_div(per_param * dense_local, dense_shards) + _ceil_div(per_param * expert_local, expert_shards)

    return RoleMemory(
        weights=e * local, grads=FP32 * local, optimizer=sharded(main_weights + ADAM_MOMENTS),
        step_temporary=sharded(FP32), gathered=0, reduce=0, root_reduce=0, largest_tensor=largest,
        synced_params=role.shape.total_params(role.head),
    )
