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


def init_layout(worker: Worker, tp: int, pp: int, ep: int = 1) -> MeshPlacement:
    """Megatron's groups for this layout, after those of the layout the worker ran before (if any) are dropped."""
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    return init_megatron_parallel(worker, tp, pp, ep)


# Adam's first step is lr * g / (|g| + eps): with eps=1e-8 the rounding noise of a near-zero gradient
# flips a whole step of size lr, so engine and reference compare under a larger eps.
ADAM_EPS = 1e-4


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
        self, model_path: str, tp: int, pp: int, sp: bool, dist_opt: bool, batch: dict, lr: float, ep: int = 1
    ) -> dict | None:
        """Builds a trainable `MegatronBackend` and reports, from TP rank 0 of the last stage, the response
        log-probs and entropies of a fixed batch, a training step's gradient norm and the exported weights."""
        from megatron.core import parallel_state as ps

        from workers.megatron.backend import MegatronBackend
        from workers.megatron.model import ParallelSettings
        from workers.training.backend import ResponseForward

        init_layout(self, tp, pp, ep)
        optim = {"lr": lr, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": ADAM_EPS, "lr_warmup_steps": 0,
                 "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": "constant", "min_lr_ratio": 0.0, "total_training_steps": None}
        engine = MegatronBackend({"path": model_path, "dtype": "float32"}, ParallelSettings(tp, pp, sp, dist_opt, ep), optim)
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
        engine.forward_backward(micros, ResponseForward("log_probs", 1.0), loss)
        grad_norm = engine.optimizer_step(1.0)
        weights = {name: t.clone() for name, t in engine.hf_weights(torch.float32)}
        if not (ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0):
            return None
        return {
            "log_probs": torch.cat([k["log_probs"] for k in kept]),
            "entropy": torch.cat([k["entropy"] for k in kept]),
            "grad_norm": grad_norm,
            "weights": weights,
            "loaded_weights": loaded,
        }

    @register(Dispatch.ONE_TO_ALL)
    def replay_routing(
        self, model_path: str, tp: int, pp: int, ep: int, batch: dict, hf_table: torch.Tensor, table: torch.Tensor,
        recompute: bool = False,
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

        init_layout(self, tp, pp, ep)
        optim = {"lr": 1e-2, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": ADAM_EPS, "lr_warmup_steps": 0,
                 "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": "constant", "min_lr_ratio": 0.0, "total_training_steps": None}
        model = {"path": model_path, "dtype": "float32", "enable_gradient_checkpointing": recompute}
        engine = MegatronBackend(model, ParallelSettings(tp, pp, tp > 1, False, ep), optim)
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
