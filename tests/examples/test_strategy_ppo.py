"""The strategy PPO example learns its task on CPU (2 gloo ranks, HF engine, real Ray), with the same worker
on either backend (Megatron: DP 2 through the megatron CPU shim)."""

import pytest

from examples import strategy_ppo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from trainer.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("strategy_ppo") / "model", seed=0))


@pytest.mark.parametrize("backend", ["fsdp2", "megatron"])
def test_strategy_ppo_example_learns_to_write_digits(ray_cluster, tiny_model, backend):
    if backend == "megatron":
        pytest.importorskip("megatron.core", reason="install the [megatron] extra")
    history = strategy_ppo.run(tiny_model, steps=12, engine_type="hf", world_size=2, backend=backend)["history"]
    rewards = [h["reward"] for h in history]
    assert rewards[0] < 0.3  # the random tiny model
    assert sum(rewards[-3:]) / 3 >= 0.8, rewards
    for h in history:  # every update reached the engine and passed its check
        assert h["rollout/sync_logprob_max_diff"] <= 1e-3
        assert h["rollout/sync_tensors"] > 0
