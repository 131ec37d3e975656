"""The worker of the Megatron layout tests (importable by Ray workers through PYTHONPATH). One group of it per world
size serves every layout of that size (tests/megatron/conftest.py): each layout method first drops the groups of the
layout before, as Megatron's own tests do between layouts in one process."""

import torch
import torch.distributed as dist

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from single_controller.mesh import MeshDispatch, MeshPlacement
from workers.megatron.parallel import init_megatron_parallel
from workers.training.mesh import TRAIN_MESH


def init_layout(worker: Worker, tp: int, pp: int, ep: int = 1, etp: int | None = None) -> MeshPlacement:
    """Megatron's groups for this layout, after those of the layout the worker ran before (if any) are dropped."""
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    return init_megatron_parallel(worker, tp, pp, ep, etp)


# Adam's first step is lr * g / (|g| + eps): with eps=1e-8 the rounding noise of a near-zero gradient
# flips a whole step of size lr, so engine and reference compare under a larger eps.
ADAM_EPS = 1e-4


def optim_settings(lr: float) -> dict:
    """A constant-LR Adam section as `MegatronBackend` reads it."""
    return {"lr": lr, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": ADAM_EPS, "lr_warmup_steps": 0,
            "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": "constant", "min_lr_ratio": 0.0, "total_training_steps": None}


def held_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (0 for those offloaded: resized to nothing), less 0-dim tensors
    (Adam's step counters, which stay where they are)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.dim()}
    return sum(nbytes for pointer, nbytes in storages.items() if pointer)


class MegatronProbe(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def init_parallel(self, tp: int, pp: int) -> dict:
        from megatron.core import parallel_state as ps

        placement = init_layout(self, tp, pp)
        return {
            "rank": self.rank,
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank(),
            "tp_group": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
            "dp_group": dist.get_process_group_ranks(ps.get_data_parallel_group()),
            "collector": placement.is_collector,
        }

    @register(dispatch_mode=MeshDispatch(TRAIN_MESH))
    def compute(self, data: DataProto) -> DataProto:
        from megatron.core import parallel_state as ps

        # Every rank of a TP group must hold the same chunk: the TP all-reduce of its sum is tp x the sum.
        local = data.batch["x"].sum().reshape(1)
        total = local.clone()
        dist.all_reduce(total, group=ps.get_tensor_model_parallel_group())
        out = data.select(batch_keys=["x"])
        out.batch["seen_by"] = torch.full((len(data),), self.rank)
        out.batch["tp_consistent"] = torch.full((len(data),), int(torch.allclose(total, local * ps.get_tensor_model_parallel_world_size())))
        return out

    @register(Dispatch.ONE_TO_ALL)
    def run(
        self, model_path: str, tp: int, pp: int, sp: bool, dist_opt: bool, batch: dict, lr: float, ep: int = 1,
        etp: int | None = None, router: dict | None = None,
    ) -> dict | None:
        """Builds a trainable `MegatronBackend` (with `router`: `RouterTraining`'s fields) and reports, from TP rank 0
        of the last stage, the response log-probs and entropies of a fixed batch, a training step's gradient norm and
        metrics, and the exported weights."""
        from megatron.core import parallel_state as ps

        from workers.megatron.backend import MegatronBackend
        from workers.megatron.model import ParallelSettings
        from workers.megatron.router_training import RouterTraining
        from workers.training.backend import ResponseForward

        init_layout(self, tp, pp, ep, etp)
        engine = MegatronBackend(
            {"path": model_path, "dtype": "float32"}, ParallelSettings(tp, pp, sp, dist_opt, ep, etp),
            optim_settings(lr), router=RouterTraining(**(router or {})),
        )
        micros = list(DataProto.from_dict(batch).split(2))  # the whole batch on every rank (each DP rank too)

        def keep(outputs, micro):
            return {"log_probs": outputs.log_probs.detach(), "entropy": outputs.entropy.detach()}

        def loss(outputs, micro):
            mask = micro.batch["response_mask"].float()
            return -(outputs.log_probs * mask).sum() / mask.sum() / len(micros), {}

        # Through the TrainBackend methods the training logic calls (workers/training/backend.py).
        loaded = {name: t.clone() for name, t in engine.hf_weights(torch.float32)}  # before any step
        kept = engine.forward_only(micros, ResponseForward("log_probs", 1.0, with_entropy=True), keep)
        engine.zero_grad()
        trained = engine.forward_backward(micros, ResponseForward("log_probs", 1.0), loss)
        grad_norm = engine.optimizer_step(1.0)
        weights = {name: t.clone() for name, t in engine.hf_weights(torch.float32)}
        if not (ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0):
            return None
        return {
            "log_probs": torch.cat([k["log_probs"] for k in kept]),
            "entropy": torch.cat([k["entropy"] for k in kept]),
            "grad_norm": grad_norm,
            "metrics": trained.kept,
            "weights": weights,
            "loaded_weights": loaded,
            "local_params": sum(p.numel() for p in engine.gpt.parameters()),  # this rank's slice (the plan's count)
        }

    @register(Dispatch.ONE_TO_ALL)
    def replay_routing(
        self, model_path: str, tp: int, pp: int, ep: int, batch: dict, hf_table: torch.Tensor, table: torch.Tensor,
        recompute: bool = False, etp: int | None = None,
    ) -> dict | None:
        """Routing replay on a trainable `MegatronBackend` (workers/megatron/router_replay.py), through the pass
        modes the actor worker sets: a recording pass (R2's log-prob pass), a comparing pass over `hf_table` (the HF
        model's choices), then a replaying forward-only pass and a replaying training step over `table` (with
        `recompute`, its layers run again in the backward). Reported from TP rank 0 of the last stage of DP rank 0."""
        from megatron.core import parallel_state as ps

        from workers.megatron.backend import MegatronBackend
        from workers.megatron.model import ParallelSettings
        from workers.routing_replay.token_order import ROUTED_EXPERTS
        from workers.training.backend import ResponseForward

        init_layout(self, tp, pp, ep, etp)
        model = {"path": model_path, "dtype": "float32", "enable_gradient_checkpointing": recompute}
        engine = MegatronBackend(model, ParallelSettings(tp, pp, tp > 1, False, ep, etp), optim_settings(1e-2))
        engine.track_routing()
        forward = ResponseForward("log_probs", 1.0)
        data = DataProto.from_dict(batch)

        def keep(outputs, micro):
            return {"log_probs": outputs.log_probs.detach()}

        def loss(outputs, micro):
            mask = micro.batch["response_mask"].float()
            return -(outputs.log_probs * mask).sum() / mask.sum() / 2, {}

        def log_prob_pass(mode, rows):
            with engine.routing.pass_mode(mode, rows, "test"):
                kept = engine.forward_only(list(rows.split(2)), forward, keep)
            return kept, engine.routing.pop_mismatch("pass")

        recorded_kept, _ = log_prob_pass("record", data)  # kept: on the last stage only
        _, compared = log_prob_pass("compare", DataProto.from_dict({**batch, ROUTED_EXPERTS: hf_table}))
        replayed = DataProto.from_dict({**batch, ROUTED_EXPERTS: table})
        replay_kept, replay_share = log_prob_pass("replay", replayed)
        engine.zero_grad()
        with engine.routing.pass_mode("replay", replayed, "test"):
            engine.forward_backward(list(replayed.split(2)), forward, loss)
        update_share = engine.routing.pop_mismatch("update")
        grad_norm = engine.optimizer_step(1.0)
        if not (ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0):
            return None
        return {
            "recorded": torch.cat([k[ROUTED_EXPERTS] for k in recorded_kept]), "compared": compared,
            "live_log_probs": torch.cat([k["log_probs"] for k in recorded_kept]), "replay_share": replay_share,
            "replay_log_probs": torch.cat([k["log_probs"] for k in replay_kept]), "update_share": update_share,
            "grad_norm": grad_norm,
        }

    @register(Dispatch.ONE_TO_ALL)
    def offload_round_trip(self, model_path: str, dp: int, dist_opt: bool, batch: dict, offload: bool) -> dict | None:
        """Two GRPO-like steps of a bf16 actor and its frozen reference under the workers' residency policy, with
        every Megatron offload switch on (moved for real on CPU) or off: old log-probs, the reference's pass, an
        update, then the hybrid engine's claim. Reports from DP rank 0 what each pass computed and how many bytes of
        weights, gradient buffers and optimizer storages were held at each point."""
        from megatron.core import parallel_state as ps

        from workers.fsdp.residency import ACTOR, DeviceTenants, Residency
        from workers.megatron.backend import MegatronBackend
        from workers.megatron.model import ParallelSettings
        from workers.megatron.offload import MegatronOffloader
        from workers.training.backend import ResponseForward

        init_layout(self, 1, 1)
        settings = ParallelSettings(1, 1, False, dist_opt)
        model = {"path": model_path, "dtype": "bfloat16"}
        actor = MegatronBackend(model, settings, optim_settings(1e-3))
        ref = MegatronBackend(model, settings)
        actor_moves = MegatronOffloader(actor, offload, offload, offload, move_on_cpu=True)
        ref_moves = MegatronOffloader(ref, offload, frozen=True, move_on_cpu=True)
        residency = Residency(ACTOR, actor_moves, DeviceTenants(), ref_moves)
        forward = ResponseForward("log_probs", 1.0)
        micros = list(DataProto.from_dict(batch).split(2))

        def keep(outputs, micro):
            return {"log_probs": outputs.log_probs.float()}

        def loss(outputs, micro):
            mask = micro.batch["response_mask"].float()
            return -(outputs.log_probs * mask).sum() / mask.sum() / len(micros), {}

        def log_probs(engine):
            return torch.cat([k["log_probs"] for k in engine.forward_only(micros, forward, keep)])

        def held():
            return {
                "weights": held_bytes(actor_moves.param_tensors()),
                "grads": held_bytes(actor_moves._gradient_buffers()),
                "optimizer": held_bytes(actor_moves.optimizer_tensors()),
                "ref": held_bytes(ref_moves.param_tensors()),
            }

        residency.offload()  # as the actor side does before the engine starts
        report = {"start": held(), "old": [], "ref": [], "grad_norm": [], "after_step": [], "generating": [], "moves": []}
        for _ in range(2):
            residency.trained_needed()
            report["old"].append(log_probs(actor))
            residency.ref_needed()
            report["ref"].append(log_probs(ref))
            residency.ref_done()
            residency.trained_needed()
            actor.zero_grad()
            actor.forward_backward(micros, forward, loss)
            report["grad_norm"].append(actor.optimizer_step(1.0))
            report["after_step"].append(held())
            report["moves"].append(residency.end_phase("update_actor"))
            residency.rollout_needs_device()  # the hybrid engine generates next
            report["generating"].append(held())
        residency.trained_needed()
        report["final"] = log_probs(actor)
        return report if ps.get_data_parallel_rank() == 0 else None

    @register(Dispatch.ONE_TO_ALL)
    def resume_round_trip(
        self, model_path: str, dp: int, dist_opt: bool, batch: dict, folder: str, dtype: str
    ) -> dict | None:
        """One Adam step, a checkpoint, a second step; then a new backend loads the checkpoint and takes the second
        step. Reports (DP rank 0) both second steps' gradient norms and the weights after them."""
        from megatron.core import parallel_state as ps

        from workers.megatron.backend import MegatronBackend
        from workers.megatron.model import ParallelSettings
        from workers.training.backend import ResponseForward

        init_layout(self, 1, 1)
        settings = ParallelSettings(1, 1, False, dist_opt)
        forward = ResponseForward("log_probs", 1.0)
        micros = list(DataProto.from_dict(batch).split(2))

        def loss(outputs, micro):
            mask = micro.batch["response_mask"].float()
            return -(outputs.log_probs.float() * mask).sum() / mask.sum() / len(micros), {}

        def step(engine):
            engine.zero_grad()
            engine.forward_backward(micros, forward, loss)
            return engine.optimizer_step(1.0)

        straight = MegatronBackend({"path": model_path, "dtype": dtype}, settings, optim_settings(1e-3))
        step(straight)
        straight.save_checkpoint(folder)
        norms = [step(straight)]
        weights = [{name: t.clone() for name, t in straight.hf_weights(torch.float32)}]
        resumed = MegatronBackend({"path": model_path, "dtype": dtype}, settings, optim_settings(1e-3))
        resumed.load_checkpoint(folder)
        norms.append(step(resumed))
        weights.append({name: t.clone() for name, t in resumed.hf_weights(torch.float32)})
        return {"grad_norms": norms, "weights": weights} if ps.get_data_parallel_rank() == 0 else None

    @register(Dispatch.ONE_TO_ALL)
    def reshard_leg(
        self, model_path: str, batch: dict, dtype: str, load_from: str | None, save_to: str, tp: int = 1,
        etp: int | None = None, ep: int = 1,
    ) -> dict | None:
        """Data-parallel over the group's ranks / `tp` (experts over expert TP `etp` x EP `ep`), the distributed
        optimizer: one Adam step (or the load of `load_from`), a checkpoint into `save_to`, one more step. Reports
        (rank 0) that step's gradient norm and the weights after it. Every rank trains on the whole batch, so the mean
        gradient is the same at any DP size."""
        from workers.megatron.backend import MegatronBackend
        from workers.megatron.model import ParallelSettings
        from workers.training.backend import ResponseForward

        init_layout(self, tp, 1, ep, etp)
        forward = ResponseForward("log_probs", 1.0)
        micros = list(DataProto.from_dict(batch).split(2))

        def loss(outputs, micro):
            mask = micro.batch["response_mask"].float()
            return -(outputs.log_probs.float() * mask).sum() / mask.sum() / len(micros), {}

        settings = ParallelSettings(tp, 1, tp > 1, True, ep, etp)
        engine = MegatronBackend({"path": model_path, "dtype": dtype}, settings, optim_settings(1e-3))
        if load_from is None:
            engine.zero_grad()
            engine.forward_backward(micros, forward, loss)
            engine.optimizer_step(1.0)
        else:
            engine.load_checkpoint(load_from)
        engine.save_checkpoint(save_to)
        engine.zero_grad()
        engine.forward_backward(micros, forward, loss)
        norm = engine.optimizer_step(1.0)
        weights = {name: t.clone() for name, t in engine.hf_weights(torch.float32)}
        return {"grad_norm": norm, "weights": weights} if self.rank == 0 else None

    @register(Dispatch.ONE_TO_ALL)
    def token_budget_passes(self, model_path: str, pp: int, batch: dict, budget: int) -> dict | None:
        """The log-probs of a batch in token-budget micro-batches (`MegatronBackend.micro_batches`) and in one
        micro-batch, and a training step over the budget's micro-batches; reported from the last stage."""
        from megatron.core import parallel_state as ps

        from workers.megatron.backend import MegatronBackend
        from workers.megatron.model import ParallelSettings
        from workers.training.backend import ResponseForward
        from workers.training.micro_batching import MicroBatching, in_row_order

        init_layout(self, 1, pp)
        engine = MegatronBackend({"path": model_path, "dtype": "float32"}, ParallelSettings(1, pp), optim_settings(1e-2))
        forward = ResponseForward("log_probs", 1.0)
        data = DataProto.from_dict(batch)
        micros, order = engine.micro_batches(data, MicroBatching(rows=1, max_tokens=budget, setting="max_token_len"))
        tokens = data.batch["response_mask"].sum()

        def keep(outputs, micro):
            return {"log_probs": outputs.log_probs.detach()}

        def loss(outputs, micro):  # weighted by tokens: the same sum whatever the split
            return -(outputs.log_probs * micro.batch["response_mask"]).sum() / tokens, {}

        budgeted = in_row_order(engine.forward_only(micros, forward, keep), order)
        whole = in_row_order(engine.forward_only([data], forward, keep), list(range(len(data))))
        engine.zero_grad()
        engine.forward_backward(micros, forward, loss)
        grad_norm = engine.optimizer_step(1.0)
        if not ps.is_pipeline_last_stage():
            return None
        return {"rows": [len(m) for m in micros], "budgeted": budgeted["log_probs"], "whole": whole["log_probs"],
                "grad_norm": grad_norm}
