"""Step metrics to every backend `trainer.logger` names (trainer/trackers/: console, jsonl, tensorboard,
wandb, mlflow, your own class); a reward-curve PNG at the end of a run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from trainer.trackers import RunInfo, StepTracker, open_backend


def _plain(value: Any) -> float | int | str:
    if hasattr(value, "item"):
        value = value.item()
    return value if isinstance(value, (int, float, str)) else str(value)


class Tracker:
    """Writes each step's metrics to every configured backend and keeps them in `history`.

    `resume_step`: the checkpoint step this run resumes from (None: it starts at step 0); each backend
    replaces or skips what a stopped run logged after it, so a step is never logged twice."""

    def __init__(
        self,
        backends: Sequence[str],
        log_dir: str | Path,
        print_fn: Callable[[str], Any] = print,
        *,
        project_name: str = "",
        experiment_name: str = "",
        config: dict[str, Any] | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.backends = list(backends)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.history: list[dict[str, Any]] = []
        run = RunInfo(self.log_dir, project_name, experiment_name, dict(config or {}), resume_step)
        self._trackers: list[StepTracker] = []
        try:
            for entry in self.backends:
                self._trackers.append(open_backend(entry, run, print_fn))
        except BaseException:
            self.close()
            raise

    def log(self, metrics: dict[str, Any], step: int) -> None:
        values = {k: _plain(v) for k, v in metrics.items()}
        self.history.append({"step": step, **values})
        for tracker in self._trackers:
            tracker.log(dict(values), step)

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        """Validation samples ({input, output, score} each; trainer.log_val_generations) to every backend that
        shows them (an optional `log_generations(samples, step)`; the others are left out)."""
        for tracker in self._trackers:
            log = getattr(tracker, "log_generations", None)
            if log is not None:
                log([dict(sample) for sample in samples], step)

    def plot_reward_curve(
        self, path: str | Path, keys: Sequence[str] = ("reward/mean", "val/reward_mean")
    ) -> Path | None:
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
        """Finish every backend once; a failing one is reported and the others still finish."""
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            finish = getattr(tracker, "finish", None) or getattr(tracker, "close", None)
            if finish is None:
                continue
            try:
                finish()
            except Exception as error:  # noqa: BLE001 - closing runs in `finally`: never hide the run's own error
                print(
                    f"warning: tracker {type(tracker).__name__} failed to finish: {type(error).__name__}: {error}",
                    file=sys.stderr,
                )
