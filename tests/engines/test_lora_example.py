"""The LoRA engine example is reproducible, trains the adapter only, and its merge rounds once: the seed fixes
the adapter's start (the same on one rank or two) and so the losses; only the adapter factors move; the
merged weight is `W + s·B·A` computed in float32 and rounded to the base's dtype once."""

import pytest
import torch

from examples import engine_lora
from workers.engines import TrainEngine


def exact_once(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    return (base.float() + scaling * (b.float() @ a.float())).to(base.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_merge_is_the_exact_sum_rounded_once(dtype):
    generator = torch.Generator().manual_seed(0)
    base = (0.02 * torch.randn(96, 64, generator=generator)).to(dtype)
    a = 0.1 * torch.randn(8, 64, generator=generator)  # an adapter that moved as far as the base (the example's)
    b = 0.1 * torch.randn(96, 8, generator=generator)
    merged = engine_lora.merged_weight(base, a, b, 2.0)
    assert merged.dtype == dtype
    assert torch.equal(merged, exact_once(base, a, b, 2.0))


def test_adding_a_rounded_delta_rounds_twice():
    # 1 + 2^-8 + 2^-20 lies just above the midpoint between the bf16 neighbours 1 and 1 + 2^-7: it rounds up.
    # Rounding the delta first drops the 2^-20, leaves the midpoint, and round-half-even goes down to 1.
    base = torch.ones(1, 1, dtype=torch.bfloat16)
    a, b = torch.ones(1, 1), torch.full((1, 1), 2.0**-8 + 2.0**-20)
    assert engine_lora.merged_weight(base, a, b, 1.0).item() == 1 + 2.0**-7
    assert (base + (b @ a).to(torch.bfloat16)).item() == 1.0


def _start(model_path: str, seed: int, world_size: int = 1, steps: int = 0) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The adapter factors as materialized (before any step), and the losses of `steps` example steps; checks
    on the way that the steps moved the adapter factors only."""
    train = TrainEngine(engine_lora.lora_policy(model_path, seed=seed)).build(world_size=world_size, use_gpu=False)
    try:
        initial = train.state_dict()
        losses = engine_lora.train_steps(train, steps)
        moved = sorted(n for n, t in train.state_dict().items() if not torch.equal(t, initial[n]))
        assert all(".lora_" in n for n in moved), moved  # the tied embedding / LM head stays frozen
        return {n: t for n, t in initial.items() if ".lora_" in n}, losses
    finally:
        train.shutdown()


@pytest.mark.slow
def test_the_seed_fixes_the_adapter_and_the_losses(ray_cluster, tmp_path):
    from trainer.tiny_model import build_tiny_model

    model_path = str(build_tiny_model(tmp_path / "model", seed=0))
    first, losses = _start(model_path, seed=0, steps=3)
    again, same_losses = _start(model_path, seed=0, steps=3)
    sharded, _ = _start(model_path, seed=0, world_size=2)  # two FSDP ranks, each keeping its shard of the draw
    other, other_losses = _start(model_path, seed=1, steps=3)

    factors_a = sorted(n for n in first if ".lora_A." in n)
    assert len(factors_a) == 3 * 2  # q, v, down_proj in each of the tiny model's 2 layers
    for name, tensor in first.items():
        assert torch.equal(tensor, again[name]) and torch.equal(tensor, sharded[name]), name
        if ".lora_B." in name:
            assert not tensor.any(), name  # B starts at zero: the adapter starts as a no-op
    assert all(not torch.equal(first[n], other[n]) for n in factors_a)
    assert losses == same_losses
    assert other_losses[0] == losses[0]  # the same first forward (B = 0), then other updates
    assert other_losses[1:] != losses[1:]
