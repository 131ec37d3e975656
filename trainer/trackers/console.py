"""`console`: one line per step with the headline metrics, then the key metrics of each feature the run turns on."""

from __future__ import annotations

from typing import Any, Callable

CONSOLE_KEYS = ("reward/mean", "val/reward_mean", "actor/pg_loss", "actor/kl_loss", "timing/step_s",
                "perf/tokens_per_s", "perf/mfu/update_actor")
# (the config key that turns a feature on, the value that means on (None: any truthy value), its key metrics)
FEATURE_KEYS: tuple[tuple[str, Any, tuple[str, ...]], ...] = (
    # DAPO's dynamic sampling: groups kept (mixed), dropped (uniform), generation batches drawn for the step
    ("algorithm.filter_groups.enable", True,
     ("filter_groups/mixed_groups", "filter_groups/uniform_groups", "filter_groups/gen_batches")),
    # asynchronous rollout, and one step off: how many weight versions behind the trained tokens are
    ("actor_rollout_ref.rollout.async_training", True,
     ("rollout/staleness", "rollout/staleness_max", "async/dropped_groups")),
    ("actor_rollout_ref.rollout.staleness", 1, ("rollout/staleness",)),
    # LoRA: only the adapter travels to the rollout engines
    ("actor_rollout_ref.model.lora_rank", None, ("rollout/sync_bytes",)),
)


def _select(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def shown_keys(config: dict[str, Any]) -> tuple[str, ...]:
    """The headline keys, then the key metrics of the features `config` (the resolved run config) turns on."""
    keys = list(CONSOLE_KEYS)
    for switch, on, feature_keys in FEATURE_KEYS:
        value = _select(config, switch)
        if (value == on) if on is not None else bool(value):
            keys.extend(feature_keys)
    return tuple(keys)


def _formatted(key: str, value: float) -> str:
    if key.endswith("_bytes"):
        return f"{key}={value / 2**20:.4g}MiB"
    return f"{key}={value:.4g}"


class ConsoleTracker:
    def __init__(
        self, print_fn: Callable[[str], Any] = print, config: dict[str, Any] | None = None, **run: Any
    ) -> None:
        self.print_fn = print_fn
        self.keys = shown_keys(config or {})

    def log(self, metrics: dict[str, Any], step: int) -> None:
        shown = [_formatted(k, metrics[k]) for k in self.keys if isinstance(metrics.get(k), (int, float))]
        self.print_fn(f"step {step}: " + "  ".join(shown))

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        for sample in samples:
            self.print_fn(f"step {step} val: [input] {sample['input']!r} [output] {sample['output']!r} "
                          f"[score] {sample['score']:.4g}")
