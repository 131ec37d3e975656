"""How megatron-core's MoE routers train: the load-balancing (auxiliary) loss, the z-loss and the router's dtype,
from verl's `megatron.override_transformer_config` keys or this project's `actor.router_aux_loss_coef`; and the
metrics of those losses after a training pass.

Two coefficients of one loss. megatron-core adds, per MoE layer, `moe_aux_loss_coeff` x the Switch Transformer
load-balancing loss (the number of experts x the sum over experts of the share of top-k assignments routed to it x
its mean routing probability; uniform routing gives 1), so verl's `moe_aux_loss_coeff=0.01` adds 0.01 per layer.
`actor.router_aux_loss_coef` means the same loss averaged over the layers (workers/moe_router_loss.py, the FSDP
workers' hook): here it is megatron-core's coefficient divided by the number of layers, so the two backends train
alike. megatron-core attaches each layer's loss to the router's output, weighted 1 / micro-batches; padding tokens
are left out (the model is given the padding mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config check reads this module's names without loading torch
    import torch

# megatron-core's names of the tracked losses (its router records them per layer while a training forward runs).
LOAD_BALANCING = "load_balancing_loss"
Z_LOSS = "z_loss"
LOAD_BALANCING_TYPES = ("aux_loss", "none")
ROUTER_DTYPES = ("fp32", "fp64")


@dataclass(frozen=True)
class RouterTraining:
    aux_loss_coeff: float = 0.0  # megatron-core's per-layer coefficient (or this project's, averaged over layers)
    averaged_over_layers: bool = False  # set from actor.router_aux_loss_coef
    z_loss_coeff: float | None = None
    router_dtype: str | None = None  # the gating's dtype (None: the compute dtype)

    @classmethod
    def from_config(
        cls, overrides: dict[str, Any] | None, router_aux_loss_coef: float | None = None
    ) -> "RouterTraining":
        """From a `megatron.override_transformer_config` section and the actor's `router_aux_loss_coef`, as
        workers/config.py validated them (at most one of the two coefficients set)."""
        overrides = overrides or {}
        coeff = router_aux_loss_coef if router_aux_loss_coef is not None else overrides.get("moe_aux_loss_coeff")
        return cls(
            aux_loss_coeff=float(coeff or 0.0),
            averaged_over_layers=router_aux_loss_coef is not None,
            z_loss_coeff=overrides.get("moe_z_loss_coeff"),
            router_dtype=overrides.get("moe_router_dtype"),
        )

    @property
    def is_default(self) -> bool:
        return self == RouterTraining()

    @property
    def tracks_losses(self) -> bool:
        return self.aux_loss_coeff > 0 or self.z_loss_coeff is not None

    def config_kwargs(self, num_layers: int) -> dict[str, Any]:
        """TransformerConfig fields of a mixture of experts' routers (over the `moe_config_kwargs` defaults)."""
        fields: dict[str, Any] = {}
        if self.aux_loss_coeff > 0:
            per_layer = self.aux_loss_coeff / num_layers if self.averaged_over_layers else self.aux_loss_coeff
            fields.update(moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=per_layer)
        if self.z_loss_coeff is not None:
            fields["moe_z_loss_coeff"] = self.z_loss_coeff
        if self.router_dtype is not None:
            fields["moe_router_dtype"] = self.router_dtype
        return fields


def _tracked_values() -> dict[str, torch.Tensor]:
    """megatron-core's per-layer sums of the tracked losses since they were last cleared (name -> [layers]); then
    clears them. megatron-core 0.19 keeps them in a tracker object; 0.16 in a dict behind two functions."""
    try:
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
    except ImportError:
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker, get_moe_layer_wise_logging_tracker

        values = {name: entry["values"].clone() for name, entry in get_moe_layer_wise_logging_tracker().items()}
        clear_aux_losses_tracker()
        return values
    tracker = get_moe_metrics_tracker()
    values = {name: entry.values.clone() for name, entry in tracker.metrics.items()}
    tracker.clear()
    return values


def clear_router_losses() -> None:
    _tracked_values()


def set_router_loss_scale(scale: float, device: torch.device) -> None:
    """The factor megatron-core puts on the router losses' gradient (its pipeline schedules set 1 / micro-batches;
    the value stays for later forwards)."""
    import torch
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale, device=device))


def router_loss_metrics(
    router: RouterTraining, micro_batches: int, num_layers: int, device: torch.device
) -> dict[str, float]:
    """The pass's router losses that `router` adds, as the FSDP workers report them: `router_aux_loss` the
    load-balancing loss (per layer, uniform routing = 1) averaged over layers and micro-batches, `router_z_loss` the
    mean squared log-sum-exp of the router logits likewise. Collective over the TP and PP groups (call on every rank);
    clears megatron-core's tracker. Under sequence parallelism each TP rank holds its tokens' part of the
    load-balancing loss (summed) and its own tokens' mean z-loss (averaged); each pipeline stage its layers'."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    values = _tracked_values()
    tp = ps.get_tensor_model_parallel_world_size()
    reported = {LOAD_BALANCING: ("router_aux_loss", 1.0, router.aux_loss_coeff > 0)}
    reported[Z_LOSS] = ("router_z_loss", 1.0 / tp, router.z_loss_coeff is not None)
    wanted = {name: (metric, tp_weight) for name, (metric, tp_weight, on) in reported.items() if on}
    totals = torch.zeros(len(wanted), dtype=torch.float64, device=device)
    for index, (name, (_, tp_weight)) in enumerate(wanted.items()):
        if name in values:  # this stage ran MoE layers
            totals[index] = values[name].double().sum().to(device) * tp_weight
    for group in (ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()):
        if dist.get_world_size(group) > 1:
            dist.all_reduce(totals, group=group)
    return {metric: float(total) / (num_layers * micro_batches) for (metric, _), total in zip(wanted.values(), totals)}
