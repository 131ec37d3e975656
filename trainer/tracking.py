"""Step metrics to the console, a JSONL file and TensorBoard; a reward-curve PNG at the end of a run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

CONSOLE_KEYS = ("reward/mean", "val/reward_mean", "actor/pg_loss", "actor/kl_loss", "timing/step_s", "perf/tokens_per_s")


def _plain(value: Any) -> float | int | str:
    if hasattr(value, "item"):
        value = value.item()
    return value if isinstance(value, (int, float, str)) else str(value)


class Tracker:
    """Writes each step's metrics to every configured backend (`console`, `jsonl`, `tensorboard`)."""

    def __init__(self, backends: Sequence[str], log_dir: str | Path, print_fn=print) -> None:
        self.backends = list(backends)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.print_fn = print_fn
        self.history: list[dict[str, Any]] = []
        self._jsonl = open(self.log_dir / "metrics.jsonl", "a") if "jsonl" in self.backends else None
        self._tensorboard = None
        if "tensorboard" in self.backends:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(self.log_dir / "tensorboard"))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self.history.append(record)
        if self._jsonl:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tensorboard:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step" and math.isfinite(value):
                    self._tensorboard.add_scalar(key, value, step)
        if "console" in self.backends:
            shown = [f"{k}={record[k]:.4g}" for k in CONSOLE_KEYS if isinstance(record.get(k), (int, float))]
            self.print_fn(f"step {step}: " + "  ".join(shown))

    def plot_reward_curve(self, path: str | Path, keys: Sequence[str] = ("reward/mean", "val/reward_mean")) -> Path | None:
        """Write a PNG of the reward over steps; None when no step logged a reward."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        plotted = False
        for key in keys:
            points = [(r["step"], r[key]) for r in self.history if isinstance(r.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points), marker="." if key.startswith("val") else None, label=key)
                plotted = True
        if not plotted:
            plt.close(fig)
            return None
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
        ax.grid(alpha=0.3)
        ax.legend()
        path = Path(path)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tensorboard:
            self._tensorboard.close()
