"""The Megatron sections' keys (`actor.megatron`, `ref.megatron`, `critic.megatron`): the layout verl's scripts set and
verl's offload switches; part of the worker config spec (workers/config_spec.py)."""

from __future__ import annotations

from typing import Any

from workers.config_fields import Field, boolean, float_in, int_at_least, one_of, optional
from workers.megatron.router_training import LOAD_BALANCING_TYPES, ROUTER_DTYPES


def megatron_layout_spec() -> dict[str, Any]:
    return {
        "tensor_model_parallel_size": Field(
            int_at_least(1), "an int >= 1 (must divide the attention and key/value heads)"
        ),
        "pipeline_model_parallel_size": Field(int_at_least(1), "an int >= 1 (must divide the layers)"),
        "expert_model_parallel_size": Field(
            int_at_least(1), "an int >= 1 (mixture of experts: must divide the experts; expert TP x EP must divide a "
            "pipeline stage's TP x DP ranks)"
        ),
        "expert_tensor_parallel_size": Field(
            optional(int_at_least(1)), "None (the TP size) or an int >= 1 (mixture of experts: each expert split over "
            "this many ranks; expert TP x EP must divide a pipeline stage's TP x DP ranks)"
        ),
        "sequence_parallel": Field(boolean, "a bool (split activations along the sequence over the TP ranks)"),
        "use_distributed_optimizer": Field(boolean, "a bool (shard the fp32 weights and Adam state over DP ranks)"),
    }


def transformer_overrides_spec() -> dict[str, Any]:
    """The keys of verl's `megatron.override_transformer_config` taken here: a mixture of experts' router settings
    (workers/megatron/router_training.py). verl's kernel and dispatcher keys are speed hints (trainer/verl_keys.py)."""
    return {
        "moe_aux_loss_coeff": Field(
            optional(float_in(0.0)), "None (off) or a float >= 0 (megatron-core's load-balancing loss, per MoE layer)"
        ),
        "moe_z_loss_coeff": Field(optional(float_in(0.0)), "None (off) or a float >= 0 (the routers' z-loss)"),
        "moe_router_load_balancing_type": Field(
            optional(one_of(*LOAD_BALANCING_TYPES)), f"None or one of {list(LOAD_BALANCING_TYPES)}"
        ),
        "moe_router_dtype": Field(
            optional(one_of(*ROUTER_DTYPES)), f"None (the compute dtype) or one of {list(ROUTER_DTYPES)}"
        ),
    }


def megatron_spec() -> dict[str, Any]:
    """A trained model's `megatron` section: its layout, verl's offload switches (workers/megatron/offload.py) and the
    router keys of its transformer config."""
    return {
        **megatron_layout_spec(),
        "override_transformer_config": transformer_overrides_spec(),
        "param_offload": Field(boolean, "a bool (GPU: the weights on the host while another tenant computes)"),
        "grad_offload": Field(boolean, "a bool (GPU: the float32 gradient buffers likewise)"),
        "optimizer_offload": Field(boolean, "a bool (GPU: main weights and Adam state on the host outside the step)"),
    }


def ref_megatron_spec() -> dict[str, Any]:
    """verl's `ref.megatron.*`: the reference runs in the actor's processes, so its layout is the actor's; a value
    set here must equal the actor's (None: the actor's). Its offload switch is its own."""
    layout = {
        key: Field(optional(field.kind), f"None (the actor's) or {field.expected}, equal to actor.megatron.{key}")
        for key, field in megatron_layout_spec().items()
    }
    offload = Field(boolean, "a bool (GPU: the frozen reference on the host outside its pass)")
    return {**layout, "param_offload": offload}
