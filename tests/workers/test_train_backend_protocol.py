"""Both training backends implement every method of `TrainBackend` with its parameters (the training logic in
workers/training/ calls them by these names), and the stock workers are one class per role for both."""

from __future__ import annotations

import inspect

import pytest

from workers.training.backend import TrainBackend


def _protocol_methods() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(TrainBackend).items()
        if callable(member) and not name.startswith("_")
    }


def _backends() -> list[type]:
    from workers.fsdp.backend import FSDPBackend

    pytest.importorskip("megatron.core")
    from workers.megatron.backend import MegatronBackend

    return [FSDPBackend, MegatronBackend]


def test_the_protocol_names_the_training_logic_calls():
    assert {"forward_backward", "forward_only", "micro_batches", "data_parallel", "optimizer_step"} <= set(
        _protocol_methods()
    )


@pytest.mark.parametrize("backend", _backends(), ids=lambda cls: cls.__name__)
def test_backend_implements_every_protocol_method(backend):
    for name, wanted in _protocol_methods().items():
        method = getattr(backend, name, None)
        assert callable(method), f"{backend.__name__} lacks {name}"
        got = [p.name for p in inspect.signature(method).parameters.values()]
        assert got == list(wanted.parameters), f"{backend.__name__}.{name}{inspect.signature(method)} != {wanted}"


def test_one_worker_class_per_role_for_both_backends():
    from omegaconf import OmegaConf

    from trainer.role_groups import worker_classes

    fsdp = OmegaConf.create({"actor_rollout_ref": {"actor": {"strategy": "fsdp"}}, "critic": {"strategy": "fsdp"}})
    megatron = OmegaConf.create(
        {"actor_rollout_ref": {"actor": {"strategy": "megatron"}}, "critic": {"strategy": "megatron"}}
    )
    assert worker_classes(fsdp) == worker_classes(megatron)
