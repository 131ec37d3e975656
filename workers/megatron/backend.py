"""`MegatronBackend`: one GPT model split over TP x PP x DP with megatron-core, optionally trainable; the
megatron-core `TrainBackend` (workers/training/backend.py).

The model is built from an HF config, loaded from the HF folder's safetensors (each rank reads only its
stage and keeps its TP slice), cast for compute by `Float16Module`, and, when trainable, wrapped in
Megatron's `DistributedDataParallel` with its optimizer (fp32 main weights; the distributed optimizer
shards them over DP). Forward/backward runs through Megatron's pipeline schedules over micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import AutoConfig

from protocol import DataProto
from workers.fsdp.model_loading import compute_dtype, worker_device
from workers.fsdp.optim import lr_factor_fn
from workers.megatron import cpu_host
from workers.megatron.checkpoint import load_megatron_checkpoint, save_megatron_checkpoint
from workers.megatron.export import iter_hf_weights
from workers.megatron.hf_reader import HFCheckpointReader
from workers.megatron.layout import layout_from_hf_config
from workers.megatron.model import (
    ParallelSettings,
    RankCoordinate,
    build_gpt_model,
    ignore_padding_lookups,
    load_stage_state,
    rope_theta,
    stage_state,
    transformer_config,
)
from workers.megatron.moe import moe_sequence_parallel_problem
from workers.megatron.router_replay import MegatronRouting
from workers.megatron.router_training import RouterTraining, clear_router_losses, router_loss_metrics
from workers.megatron.rows_forward import common_left_padding, padded_length, sequence_forward
from workers.megatron.training_hooks import BackendHooks
from workers.megatron.vocab_parallel import log_probs_and_entropy
from workers.routing_replay.token_order import ROUTED_EXPERTS
from workers.training.backend import (
    DataParallel,
    MicroKeep,
    MicroLoss,
    MicroResults,
    ResponseForward,
    ResponseOutputs,
    require_trainable,
)
from workers.training.dist_utils import reduce_over_ranks
from workers.training.micro_batching import MicroBatching

# (last-stage output [b, S, V/tp] or values [b, S, 1], the micro-batch) -> (scalar loss, outputs to keep)
StageLossFn = Callable[[torch.Tensor, DataProto], tuple[torch.Tensor, dict[str, Any]]]


class MegatronBackend:
    def __init__(
        self,
        model_cfg: dict[str, Any],
        settings: ParallelSettings,
        optim_cfg: dict[str, Any] | None = None,
        value_head: bool = False,
        seed: int = 0,
        max_positions: int = 4096,
        router: RouterTraining | None = None,
    ) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module

        cpu_host.enable()
        self.device = worker_device()
        self.model_path: str = model_cfg["path"]
        self.dtype = compute_dtype(model_cfg["dtype"], self.device)
        self.settings = settings
        self.value_head = value_head
        self.router = router or RouterTraining()  # a mixture of experts' router losses and dtype
        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        self.config_overrides: dict[str, Any] = dict(model_cfg.get("override_config") or {})  # verl's key
        for key, value in self.config_overrides.items():
            setattr(self.hf_config, key, value)
        self.layout = layout_from_hf_config(
            self.hf_config, settings.tp, settings.pp, ep=settings.ep, etp=settings.expert_tp
        )
        problem = moe_sequence_parallel_problem(self.layout.moe, settings.tp, settings.sequence_parallel)
        if problem is not None and optim_cfg is not None:
            raise ValueError(problem)
        if self.device.type == "cuda":
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(seed)
        # A frozen model runs no backward: nothing to recompute.
        recompute = bool(model_cfg.get("enable_gradient_checkpointing")) and optim_cfg is not None
        self.config = transformer_config(self.hf_config, self.layout, settings, self.dtype, recompute, self.router)
        torch.manual_seed(seed)  # a new value head starts equal on every rank
        self.gpt = build_gpt_model(self.config, self.layout, max_positions, rope_theta(self.hf_config), value_head)
        state = stage_state(
            HFCheckpointReader(self.model_path), self.layout, settings, RankCoordinate.current(), value_head
        )
        load_stage_state(self.gpt, state, value_head)
        ignore_padding_lookups(self.gpt, getattr(self.hf_config, "pad_token_id", None))
        self.gpt.to(self.device)
        model: nn.Module = Float16Module(self.config, self.gpt) if self.dtype != torch.float32 else self.gpt
        self.routing: MegatronRouting | None = None  # track_routing()
        self.optimizer = None
        self._hooks = BackendHooks()  # add_hooks
        self.optim_cfg = optim_cfg
        self.steps = 0  # LR-schedule position (scheduler steps taken)
        if optim_cfg is None:
            model.requires_grad_(False)
            model.eval()
            self.model = model
            return
        distributed = settings.use_distributed_optimizer
        self.model = ddp = DistributedDataParallel(
            self.config,
            DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=distributed),
            model,
        )
        self.config.no_sync_func = ddp.no_sync
        self.config.finalize_model_grads_func = finalize_model_grads
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=optim_cfg["lr"],
                weight_decay=optim_cfg["weight_decay"],
                adam_beta1=optim_cfg["betas"][0],
                adam_beta2=optim_cfg["betas"][1],
                adam_eps=optim_cfg["eps"],
                clip_grad=1.0,  # replaced per step by the caller's grad_clip
                bf16=self.dtype == torch.bfloat16,
                fp16=self.dtype == torch.float16,
                params_dtype=torch.float32,
                use_distributed_optimizer=distributed,
            ),
            [ddp],
        )
        self._lr_factor = lr_factor_fn(optim_cfg)
        self._set_lr()

    # ---- forward / backward ---------------------------------------------------------------------------
    def run_micro_batches(
        self, micros: list[DataProto], loss_fn: StageLossFn, forward_only: bool
    ) -> list[dict[str, Any]]:
        """Megatron's pipeline schedule over `micros` (each with batch keys `input_ids`, `attention_mask` [b, S]);
        `loss_fn` runs on the last stage with the output cut back to the positions run (S less the columns every row
        pads on the left). Returns, on the last stage, what `loss_fn` kept per micro-batch ([] elsewhere). Gradients
        accumulate (Megatron divides each loss by the number of micro-batches; this undoes it, so `loss_fn` chooses
        the weights)."""
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        count = len(micros)
        lead = self._skipped_columns(micros)
        length = micros[0].batch["input_ids"].shape[1] - lead
        padded = padded_length(length, self.settings)

        def on_last_stage(micro: DataProto, output: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            loss, kept = loss_fn(output[:, :length], micro)
            return loss * count, kept

        def forward_step(iterator: Iterator[DataProto], model: nn.Module) -> tuple[torch.Tensor, Any]:
            micro = next(iterator)
            ids, mask = micro.batch["input_ids"][:, lead:], micro.batch["attention_mask"][:, lead:]
            with self._routing_context(micro, padded, forward_only):
                output = sequence_forward(model, ids, mask, self.settings, self.device, self.router.tracks_losses)
            return output, partial(on_last_stage, micro)

        # Token-budget micro-batches may differ by a row: pipeline stages then send each one's shape first.
        self.config.variable_seq_lengths = len({len(m) for m in micros}) > 1
        self.model.train(not forward_only)
        context = torch.no_grad() if forward_only else torch.enable_grad()
        with context:
            kept = get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(micros),
                model=[self.model],
                num_microbatches=count,
                seq_length=padded,
                micro_batch_size=len(micros[0]),
                forward_only=forward_only,
            )
        return list(kept) if ps.is_pipeline_last_stage() else []

    def _skipped_columns(self, micros: list[DataProto]) -> int:
        """The leading columns a pass over `micros` does not run: those every row pads (one width for all
        micro-batches: the pipeline sends one shape). Outputs are read from the right (the responses), so they
        need no shift; routing replay's tables index the full width, so with routing tracked every column runs."""
        if self.routing is not None:
            return 0
        lead = common_left_padding(micros)
        batch = micros[0].batch
        if "responses" in batch.keys():  # every response position (and the one before) stays
            lead = min(lead, batch["input_ids"].shape[1] - batch["responses"].shape[1] - 1)
        return lead

    # ---- routing replay (workers/megatron/router_replay.py) -------------------------------------------
    def track_routing(self) -> None:
        """The routers' replay objects for routing replay (actor.router_replay.mode)."""
        if self.layout.moe is None:
            raise ValueError(
                f"routing replay (actor.router_replay.mode / rollout.enable_rollout_routing_replay) is set, but "
                f"{self.hf_config.model_type!r} is a dense model (no router); set actor.router_replay.mode=disabled "
                "and rollout.enable_rollout_routing_replay=false"
            )
        recompute = self.config.recompute_granularity is not None
        self.routing = MegatronRouting(
            self.gpt, self.layout.num_layers, self.settings.sequence_parallel, self.device, recompute
        )

    def _routing_context(self, micro: DataProto, padded: int, forward_only: bool):  # noqa: ANN202 - a context manager
        return self.routing.micro_batch(micro, padded, not forward_only) if self.routing is not None else nullcontext()

    # ---- the training logic's micro-batches (TrainBackend) ------------------------------------------
    def data_parallel(self) -> DataParallel:
        """Megatron's DDP averages gradients over the data-parallel group of this rank's TP x PP coordinate."""
        from megatron.core import parallel_state as ps

        group = ps.get_data_parallel_group()
        return DataParallel(dist.get_world_size(group), group)

    def reports_outputs(self) -> bool:
        from megatron.core import parallel_state as ps

        return ps.is_pipeline_last_stage()

    def micro_batches(self, data: DataProto, batching: MicroBatching) -> tuple[list[DataProto], list[int]]:
        """Fixed row counts, or with a token budget (use_dynamic_bsz) as many rows as fit it padded: a pass runs
        every row at one width (S less the columns every row pads on the left), so a micro-batch of n rows costs
        n x that width, whatever its rows' real lengths. Every rank runs the same number of micro-batches (the
        largest any rank needs: expert-parallel ranks exchange tokens in each forward), their rows split evenly
        in order. Collective with a budget: call on every rank."""
        order = list(range(len(data)))
        if batching.max_tokens is None:
            return list(data.split(batching.rows)), order
        width = data.batch["input_ids"].shape[1] - self._skipped_columns([data])  # the width its pass will run
        needed = {"count": -(-len(data) // max(1, batching.max_tokens // width)), "width": width}
        # Agreed first, so that a budget too small for some rank's rows stops every rank (none waits in a collective).
        agreed = reduce_over_ranks(needed, self.device, {"count": "max", "width": "max"})
        if agreed["width"] > batching.max_tokens:
            widest = int(agreed["width"])
            raise ValueError(
                f"{batching.setting}={batching.max_tokens} holds no row of this pass: Megatron runs rows padded to "
                f"{widest} positions; raise it to at least {widest}"
            )
        rows = torch.arange(len(data)).tensor_split(max(1, min(int(agreed["count"]), len(data))))
        return [data[index] for index in rows], order

    def response_outputs(self, output: torch.Tensor, micro: DataProto, forward: ResponseForward) -> ResponseOutputs:
        """Last-stage output (logits [b, S, V/tp] or values [b, S, 1]) at the response tokens [b, R]."""
        length = micro.batch["responses"].shape[1]
        predictors = output[:, -length - 1 : -1]  # the outputs at P-1 .. P+R-2 score the R response tokens
        if forward.kind == "values":
            return ResponseOutputs(output.device, values=predictors[..., 0].float())
        responses = micro.batch["responses"].to(output.device)
        log_probs, entropy = log_probs_and_entropy(
            predictors / forward.temperature, responses, self.layout.vocab_size, forward.with_entropy
        )
        if entropy is not None and not forward.entropy_grad:
            entropy = entropy.detach()  # only reported: no gradient flows through it
        return ResponseOutputs(output.device, log_probs=log_probs, entropy=entropy)

    def forward_backward(self, micros: list[DataProto], forward: ResponseForward, loss_fn: MicroLoss) -> MicroResults:
        require_trainable(self.optimizer, "forward_backward")

        def stage_loss(output: torch.Tensor, micro: DataProto) -> tuple[torch.Tensor, dict[str, Any]]:
            return loss_fn(self.response_outputs(output, micro, forward), micro)

        if not self.router.tracks_losses:
            return MicroResults(self.run_micro_batches(micros, stage_loss, forward_only=False))
        clear_router_losses()  # what earlier passes left
        kept = self.run_micro_batches(micros, stage_loss, forward_only=False)
        router_metrics = router_loss_metrics(self.router, len(micros), self.layout.num_layers, self.device)
        return MicroResults([{**metrics, **router_metrics} for metrics in kept])

    def forward_only(
        self, micros: list[DataProto], forward: ResponseForward, keep: MicroKeep
    ) -> list[dict[str, torch.Tensor]]:
        def stage_keep(output: torch.Tensor, micro: DataProto) -> tuple[torch.Tensor, dict[str, Any]]:
            return output.new_zeros(()), keep(self.response_outputs(output, micro, forward), micro)

        kept = self.run_micro_batches(micros, stage_keep, forward_only=True)
        if self.routing is not None and self.routing.mode == "record":  # routing replay R2: the experts chosen
            tables = self.routing.recorded_tables()  # collective: every stage's layers
            for outputs, table in zip(kept, tables):  # kept is empty before the last stage
                outputs[ROUTED_EXPERTS] = table
        return kept

    # ---- optimizer ------------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        require_trainable(self.optimizer, "zero_grad")
        self._hooks.run("before_zero_grad")
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def optimizer_step(self, grad_clip: float) -> float:
        """Clip to `grad_clip` and step; returns the global gradient norm before clipping (a non-finite
        norm skips the update, as Megatron's optimizer decides the same on every rank)."""
        require_trainable(self.optimizer, "optimizer_step")
        for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            opt.config.clip_grad = grad_clip
        self._hooks.run("before_step")
        _, grad_norm, _ = self.optimizer.step()
        self._hooks.run("after_step")
        return float(grad_norm) if grad_norm is not None else float("nan")

    def add_hooks(self, **hooks: Callable[[], None]) -> dict[str, Callable[[], None]]:
        """Callables run at `BackendHooks.POINTS` (the offloader's moves: Megatron's step reads and writes the
        optimizer's state outside its inner torch optimizer's step, where torch's hooks fire)."""
        return self._hooks.add(**hooks)

    def _set_lr(self) -> None:
        lr = self.optim_cfg["lr"] * self._lr_factor(self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def current_lr(self) -> float:
        require_trainable(self.optimizer, "current_lr")
        return float(self.optimizer.param_groups[0]["lr"])

    def lr_scheduler_step(self) -> None:
        require_trainable(self.optimizer, "lr_scheduler_step")
        self.steps += 1
        self._set_lr()

    # ---- weights out ----------------------------------------------------------------------------------
    def hf_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole model as (HF name, tensor) pairs, on every rank; a collective (see export.py)."""
        if self.value_head:
            raise RuntimeError("hf_weights: a value model has no HF causal-LM weights to export")
        return iter_hf_weights(self.gpt, self.layout, dtype or self.dtype, self.device)

    def export_hf(self, path: str) -> None:
        """Write the model as an HF checkpoint (safetensors) from rank 0, tokenizer files copied along."""
        from transformers import AutoModelForCausalLM

        from workers.fsdp.checkpoint import save_hf_folder

        rank = dist.get_rank()
        # Every rank runs the stream (it is a collective); only rank 0 keeps the tensors.
        state = {name: t.cpu() for name, t in self.hf_weights(torch.float32) if rank == 0}
        if rank == 0:
            save_hf_folder(state, AutoModelForCausalLM, self.hf_config, path, self.model_path)
        dist.barrier()

    # ---- checkpoints (workers/megatron/checkpoint.py) ------------------------------------------------------
    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        """The model slice, optimizer, LR position, RNG state and `extra`; a collective."""
        require_trainable(self.optimizer, "save_checkpoint")
        save_megatron_checkpoint(self, path, extra)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore what `save_checkpoint` wrote (same TP/PP/EP sizes, any DP size); returns the caller's `extra`."""
        require_trainable(self.optimizer, "load_checkpoint")
        extra = load_megatron_checkpoint(self, path)
        self._set_lr()
        return extra
