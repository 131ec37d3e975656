"""A strategy object for users who write their own training loop inside a `Worker`:

    strategy = get_strategy({"backend": "fsdp2"})
    model, optimizer, scheduler = strategy.prepare(model, optimizer, scheduler)
    strategy.backward(loss, model, optimizer)
    grad_norm = strategy.optimizer_step(optimizer, model, scheduler, name="actor")

See docs/strategy.md.
"""

from typing import Any

from workers.strategy.base import Strategy
from workers.strategy.config import InferenceConfig, StrategyConfig


def get_strategy(config: Any = None) -> Strategy:
    """The strategy `config["backend"]` names ("fsdp2" or "megatron"); call it inside a worker method."""
    parsed = StrategyConfig.parse(config)
    if parsed.backend == "megatron":
        from workers.strategy.megatron import MegatronStrategy

        return MegatronStrategy(parsed)
    from workers.strategy.fsdp import FSDPStrategy

    return FSDPStrategy(parsed)


__all__ = ["InferenceConfig", "Strategy", "StrategyConfig", "get_strategy"]
