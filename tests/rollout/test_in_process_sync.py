"""The in-process sync shared by the hybrid rollout and the strategy API: what it loads, what it reports and
when it raises, with a one-process fake trainer and engine (no process group)."""

import pytest
import torch

from workers.rollout.in_process_sync import InProcessSync
from workers.rollout.verify import WeightSyncMismatch


def _log_probs(weights: dict[str, torch.Tensor], probe: torch.Tensor) -> torch.Tensor:
    """A stand-in forward: every log-prob is the weights' sum, so the probe sees any change of them."""
    total = float(sum(t.sum() for t in weights.values()))
    return torch.full((probe.shape[0], probe.shape[1] - 1), total)


class Trainer:
    lora = None
    vocab_size = 11

    def __init__(self) -> None:
        self.weights = {"a": torch.ones(3), "b": torch.zeros(2)}

    def named_weights(self, layouts):
        return ((name, tensor.clone()) for name, tensor in self.weights.items())

    def probe_log_probs(self, probe: torch.Tensor) -> torch.Tensor:
        return _log_probs(self.weights, probe)


class Engine:
    def __init__(self, trainer: Trainer) -> None:
        self.weights = {name: tensor.clone() for name, tensor in trainer.weights.items()}
        self.drops: set[str] = set()  # names it ignores, as a broken name mapping would
        self.offset = 0.0  # added to what it loads, as a wrong conversion would

    def load_weights(self, pairs) -> int:
        count = 0
        for name, tensor in pairs:
            if name not in self.drops:
                self.weights[name] = tensor + self.offset
            count += 1
        return count

    def fingerprint(self) -> float:
        return float(sum(t.double().abs().sum() for t in self.weights.values()))

    def prompt_log_probs(self, probe: torch.Tensor) -> torch.Tensor:
        return _log_probs(self.weights, probe)


def _sync(tolerance: float | None = None) -> tuple[Trainer, Engine, InProcessSync]:
    trainer = Trainer()
    engine = Engine(trainer)
    sync = InProcessSync(engine, [], torch.float32, True, tolerance, "test sync", tolerance_setting="the test's bound")
    sync.take_trainer_fingerprint(trainer)
    return trainer, engine, sync


def test_a_changed_model_is_loaded_checked_and_reported_under_rollout_names():
    trainer, engine, sync = _sync()
    trainer.weights["a"] += 0.5
    metrics = sync.load(trainer)
    assert engine.weights["a"].tolist() == [1.5] * 3
    assert metrics["rollout/sync_tensors"] == 2.0 and metrics["rollout/sync_logprob_max_diff"] == 0.0
    assert {"rollout/sync_s", "rollout/sync_gib", "rollout/sync_bytes"} <= set(metrics)
    assert sync.load(trainer)["rollout/sync_logprob_max_diff"] == 0.0  # nothing changed on either side: passes


def test_a_lost_tensor_fails_the_probe_and_names_the_setting():
    trainer, engine, sync = _sync()
    engine.drops.add("b")
    trainer.weights["b"] += 1.0
    with pytest.raises(WeightSyncMismatch, match=r"^test sync: .* differ .*; the test's bound sets the bound$"):
        sync.load(trainer)


def test_the_fingerprints_catch_what_the_probe_misses():
    trainer, engine, sync = _sync(tolerance=1e9)  # a probe that passes anything
    engine.drops.update(trainer.weights)
    trainer.weights["a"] += 1.0
    with pytest.raises(WeightSyncMismatch, match="the sync loaded nothing"):
        sync.load(trainer)
    engine.drops.clear()
    sync.load(trainer)
    engine.weights["b"] += 1.0  # changed while asleep (released weights come back as they may)
    sync.load(trainer, compare=False)  # nothing to compare the engine with; the load restores it
    engine.offset = 1.0
    with pytest.raises(WeightSyncMismatch, match="loaded something other than the trainer's weights"):
        sync.load(trainer)

def test_without_the_starting_fingerprint_the_first_load_checks_the_probe_only():
    trainer = Trainer()
    engine = Engine(trainer)
    engine.drops.update(trainer.weights)
    sync = InProcessSync(engine, [], torch.float32, True, 1e9, "test sync")
    trainer.weights["a"] += 1.0
    sync.load(trainer)  # nothing loaded, and nothing to compare the engine's change with
    trainer.weights["a"] += 1.0
    with pytest.raises(WeightSyncMismatch, match="the sync loaded nothing"):
        sync.load(trainer)
