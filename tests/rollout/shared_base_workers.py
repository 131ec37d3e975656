"""A LoRA actor worker with a hybrid vLLM engine that also reports on its shared base (importable by Ray workers
through PYTHONPATH). The engine's tensors are read from vLLM's own model (`named_parameters` of the model the
engine runs), not through the sharing code's views."""

from __future__ import annotations

from typing import Any

import torch

from single_controller import Dispatch, register
from workers.actor import ActorRolloutRefWorker
from workers.fsdp.offload import module_state_tensors
from workers.fsdp.shared_storage import local_shard
from workers.fsdp.storage_offload import device_storages
from workers.lora.spec import is_adapter_parameter
from workers.rollout.verify import probe_sequences


def _engine_model(worker: Any) -> Any:
    return worker.model_runner.get_model()


def _engine_storages(worker: Any) -> dict[str, tuple[int, int]]:
    """The engine's parameter name -> [start, end) byte range of the storage behind it."""
    out = {}
    for name, param in _engine_model(worker).named_parameters():
        storage = param.untyped_storage()
        out[name] = (storage.data_ptr(), storage.data_ptr() + storage.nbytes())
    return out


class SharedBaseProbe(ActorRolloutRefWorker):
    def _engine_call(self, fn: Any) -> Any:
        (result,) = self.hybrid_rollout.engine.llm.collective_rpc(fn)
        return result

    @register(Dispatch.ONE_TO_ALL)
    def base_placement(self) -> dict[str, Any]:
        """Per frozen base parameter: the engine parameter whose storage holds this rank's shard (None: none),
        the shard's byte offset in it, its bytes and its values; plus the sharing report."""
        storages = self._engine_call(_engine_storages)
        placement = {}
        for name, param in self.side.shared_base.params.items():
            local = local_shard(param)
            start, end = local.data_ptr(), local.data_ptr() + local.numel() * local.element_size()
            owner = next((engine for engine, (lo, hi) in storages.items() if lo <= start and end <= hi), None)
            placement[name] = {
                "engine_param": owner, "offset": start - storages[owner][0] if owner else None,
                "bytes": end - start, "values": local.detach().clone(),
            }
        report = self.side.shared_base.report
        return {"placement": placement, "metrics": report.metrics(), "unshared": dict(report.unshared), "rank": self.rank}

    @register(Dispatch.ONE_TO_ALL)
    def write_both_ways(self, trainer_name: str, engine_name: str, first_row: int, rows_per_rank: int) -> dict[str, Any]:
        """Double this rank's shard of `trainer_name` through the trainer's tensor, read the engine's
        parameter `engine_name` and its probe log-probs; halve back, through the engine's tensor, the rows
        where the shard should be (`first_row + rank * rows_per_rank` on), and read the trainer's shard."""
        engine = self.hybrid_rollout.engine
        probe = probe_sequences(self.actor.module.config.vocab_size)
        local = local_shard(self.side.shared_base.params[trainer_name])
        original = local.detach().clone()
        before = engine.prompt_log_probs(probe)
        engine_param = self._engine_call(lambda worker: _engine_model(worker).get_parameter(engine_name))
        with torch.no_grad():
            local.mul_(2.0)
        engine_after_trainer_write = engine_param.detach().clone()
        changed = engine.prompt_log_probs(probe)
        with torch.no_grad():
            engine_param.narrow(0, first_row + self.rank * rows_per_rank, rows_per_rank).mul_(0.5)
        restored = engine.prompt_log_probs(probe)
        return {
            "original": original, "engine_after_trainer_write": engine_after_trainer_write,
            "trainer_after_engine_write": local.detach().clone(), "before": before, "changed": changed, "restored": restored,
        }

    @register(Dispatch.ONE_TO_ALL)
    def offload_round_trip(self) -> dict[str, Any]:
        """The actor's own offloader, with its moves made real on CPU: offload, read, load."""
        offloader = self.side.residency.trained
        offloader.moves_bytes = True
        module = self.actor.module
        every = len(device_storages(module_state_tensors(module), self.actor.device))
        movable = len(device_storages(module_state_tensors(module), self.actor.device, self.side.shared_base.stays))
        engine_before = {name: p.detach().clone() for name, p in self._engine_call(
            lambda worker: dict(_engine_model(worker).named_parameters())).items()}
        adapter_bytes = sum(local_shard_bytes(p) for n, p in module.named_parameters() if is_adapter_parameter(n))
        buffer_bytes = sum(b.numel() * b.element_size() for b in module.buffers())  # the rotary frequencies
        offloader.offload()
        offloaded = offloader.params.offloaded_bytes
        base_sizes = {n: local_shard(p).untyped_storage().nbytes() for n, p in self.side.shared_base.params.items()}
        adapter_sizes = [p.to_local().untyped_storage().nbytes() for n, p in module.named_parameters() if is_adapter_parameter(n)]
        engine_during = self._engine_call(lambda worker: {n: p.detach().clone() for n, p in _engine_model(worker).named_parameters()})
        offloader.load()
        return {
            "storages": every, "movable_storages": movable, "offloaded_bytes": offloaded,
            "adapter_bytes": adapter_bytes, "buffer_bytes": buffer_bytes,
            "base_storage_bytes": base_sizes, "adapter_storage_bytes": adapter_sizes,
            "engine_unchanged": all(torch.equal(engine_before[n], t) for n, t in engine_during.items()),
        }


def local_shard_bytes(param: torch.Tensor) -> int:
    local = param.to_local()
    return local.numel() * local.element_size()
