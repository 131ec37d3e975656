"""Judge a training run by its metrics.jsonl (one JSON object per step; `reward/mean` is the step's mean
training reward): `--last-at-least X` wants the last step's reward >= X, `--rises-by D` wants the mean of the
last three steps at least D above the mean of the first three. Prints one line; exit 1 when it fails."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REWARD = "reward/mean"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("metrics", type=Path)
    parser.add_argument("--last-at-least", type=float)
    parser.add_argument("--rises-by", type=float)
    args = parser.parse_args()
    if not args.metrics.is_file():
        print(f"no metrics file {args.metrics}")
        return 1
    rows = [json.loads(line) for line in args.metrics.read_text().splitlines() if line.strip()]
    rewards = [row[REWARD] for row in rows if REWARD in row]
    if len(rewards) < 3:
        print(f"{args.metrics}: {len(rewards)} steps with {REWARD}; a run of at least 3 steps is expected")
        return 1
    first, last = statistics.mean(rewards[:3]), statistics.mean(rewards[-3:])
    print(f"{len(rewards)} steps, {REWARD}: first {rewards[0]:.3f}, last {rewards[-1]:.3f} "
          f"(mean of the first 3 {first:.3f}, of the last 3 {last:.3f})")
    if args.last_at_least is not None and rewards[-1] < args.last_at_least:
        print(f"the last reward {rewards[-1]:.3f} is below {args.last_at_least}")
        return 1
    if args.rises_by is not None and last - first < args.rises_by:
        print(f"the reward rose by {last - first:.3f}, less than {args.rises_by}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
