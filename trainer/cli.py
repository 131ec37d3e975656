"""The command line shared by `trainer.main` and the recipes: hydra overrides, `--cfg job`, `--help`,
one `error:` line with exit code 2 for anything wrong before training starts, and one `interrupted:` line
with exit code 130 for Ctrl-C."""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from trainer.checkpointing import CheckpointError
from trainer.cli_help import usage_text
from trainer.config_loader import ConfigError
from trainer.interrupts import EXIT_CODE as INTERRUPTED_EXIT_CODE
from trainer.interrupts import interrupted_message
from trainer.preflight import InputError

# Problems found before any worker starts: bad config, bad paths or data, unusable checkpoints.
USER_ERRORS = (ConfigError, InputError, CheckpointError)


def run_cli(
    argv: Sequence[str],
    load: Callable[[list[str]], DictConfig],
    run: Callable[[DictConfig], Any],
    recipes: Sequence[str] = (),
) -> int:
    """Parse `argv` (overrides plus an optional `--cfg job`), then print the config or run; 2 on bad input,
    130 on Ctrl-C. `recipes`: the built-in recipe names `--help` lists."""
    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(usage_text(recipes))
        return 0
    print_cfg = "--cfg" in args
    if print_cfg:
        at = args.index("--cfg")
        what = args[at + 1] if at + 1 < len(args) else "job"
        if what != "job":
            print(f"error: --cfg supports 'job' (the resolved config), got {what!r}", file=sys.stderr)
            return 2
        del args[at : at + 2]
    cfg = None
    try:
        cfg = load(args)
        if print_cfg:
            print(OmegaConf.to_yaml(cfg))
            return 0
        run(cfg)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:  # every Ctrl-C: one line, no traceback (the run released its workers)
        print(interrupted_message(cfg, interrupt), file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT_CODE
    return 0
