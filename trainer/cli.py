"""The command line shared by `trainer.main` and the recipes: hydra overrides, `--cfg job`, clear errors."""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from trainer.config_loader import ConfigError


def run_cli(argv: Sequence[str], load: Callable[[list[str]], DictConfig], run: Callable[[DictConfig], Any]) -> int:
    """Parse `argv` (overrides plus an optional `--cfg job`), then print the config or run; 2 on bad config."""
    args = list(argv)
    print_cfg = "--cfg" in args
    if print_cfg:
        at = args.index("--cfg")
        what = args[at + 1] if at + 1 < len(args) else "job"
        if what != "job":
            print(f"--cfg supports 'job' (the resolved config), got {what!r}", file=sys.stderr)
            return 2
        del args[at : at + 2]
    try:
        cfg = load(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if print_cfg:
        print(OmegaConf.to_yaml(cfg))
        return 0
    run(cfg)
    return 0
