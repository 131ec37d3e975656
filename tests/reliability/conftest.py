"""Small model and data shared by the reliability tests, plus the overrides of a short training run."""

from pathlib import Path

import pytest

from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def small_assets(tmp_path_factory) -> dict[str, str]:
    """The embedded tiny model and 64 synthetic training prompts, built once per session."""
    root = tmp_path_factory.mktemp("reliability_assets")
    model = build_tiny_model(root / "model", seed=0)
    train, val = write_synthetic_dataset(root / "data", train_size=64, val_size=16, seed=0)
    return {"model": str(model), "train": str(train), "val": str(val)}


def short_run(assets: dict[str, str], out_dir: Path, *extra: str) -> list[str]:
    """Overrides of a short run without validation: two steps unless `extra` says otherwise."""
    return [
        f"actor_rollout_ref.model.path={assets['model']}",
        f"data.train_files={assets['train']}",
        "data.val_files=null",
        f"trainer.default_local_dir={out_dir}",
        "trainer.logger=[console,jsonl]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.total_training_steps=2",
        *extra,
    ]


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
