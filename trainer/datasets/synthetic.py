"""Synthetic rule-scored RL datasets, written as verl-layout parquet files.

    python -m trainer.datasets.synthetic OUT_DIR [--train-size N --val-size M --seed S]
        [--tasks char_class,arithmetic] [--char-classes digits,vowels]

Columns: data_source (str), prompt (list of {"role", "content"}), ability (str),
reward_model {"style": "rule", "ground_truth": str}, extra_info {"split", "index"}.

synthetic/char_class (the default task) exists so that a RANDOM tiny model
(trainer/tiny_model.py) visibly learns by RL alone on 2 CPU cores in a few minutes:
  * Prompt: "write 8 digits." / "write 8 vowels." in a few phrasings; ground truth
    "digits:8". Score: fraction of the first 8 response characters in the class
    (trainer/rewards/char_class.py), so each correct character is partial credit.
  * Why it is learnable: every token is one character, and the tiny vocabulary has
    ~100 tokens of which 10 are digits and 10 vowels. A random policy already puts ~10%
    of its characters in the class, so among 8 samples of a prompt some score higher
    than others and GRPO gets a signal from step one; the model only has to raise
    the logits of one fixed token set, chosen by a single word of the prompt.
  * Why it tests something: the class word changes the target, so an unconditioned
    policy (say, all digits) scores at most ~0.5 on a two-class mix; reaching 1.0
    needs the prompt to matter. Phrasing varies so the model must attend to the
    class word, not memorize two strings.
  * Measured with this repo's pieces (tiny model, RLDataset, RuleRewardManager, GRPO
    advantage + PPO loss, on-policy, 16 prompts x 8 samples, 8 new tokens, no KL):
    the random tiny model scores ~0.09; lr 1e-3 reached 0.94 at step 40 (seed 0) and
    0.97 at step 59 (seed 2); lr 2e-3 reached 0.91 at step 40 and >= 0.99 from step 50;
    lr 5e-3 is faster (0.94 at step 20) but one seed dipped from 0.99 back to ~0.85.
  * Prompt length: at most 50 tokens with the tiny character tokenizer (arithmetic
    prompts up to 70), so max_prompt_length 64 (96 with arithmetic) fits.

synthetic/tool_vault is the multi-turn tool task (workers/agent_tasks/vault.py, docs/agents.md).

synthetic/visual_colors is the image task for the tiny vision-language model (trainer/datasets/visual_colors.py,
docs/vision.md); its files have an `images` column.

synthetic/arithmetic is a GSM8K-style family for real models: "what is 12 + 7 * 3?"
with the answer expected after `####`; scored by exact match (see
trainer/rewards/math_answer.py). A random tiny model scores 0 on it.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trainer.datasets.visual_colors import IMAGE_COLUMN, IMAGE_TYPE, make_visual_colors_row
from trainer.rewards.char_class import CHAR_CLASSES, DEFAULT_LENGTH

CHAR_CLASS_SOURCE = "synthetic/char_class"
ARITHMETIC_SOURCE = "synthetic/arithmetic"
TOOL_VAULT_SOURCE = "synthetic/tool_vault"
TASKS = ("char_class", "arithmetic", "tool_vault", "visual_colors")
IMAGE_TASKS = ("visual_colors",)
DEFAULT_CHAR_CLASSES = ("digits", "vowels")

_CHAR_CLASS_TEMPLATES = (
    "write {n} {name}.",
    "please write {n} {name}.",
    "reply with {n} {name}.",
    "give me {n} {name}, nothing else.",
)

# Explicit schema so every file has the same types whatever tasks it mixes.
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())])),
    ]
)


def make_char_class_row(rng: random.Random, classes: Sequence[str] = DEFAULT_CHAR_CLASSES) -> dict[str, Any]:
    """One char_class example (without extra_info)."""
    name = rng.choice(list(classes))
    content = rng.choice(_CHAR_CLASS_TEMPLATES).format(n=DEFAULT_LENGTH, name=name)
    return {
        "data_source": CHAR_CLASS_SOURCE,
        "prompt": [{"role": "user", "content": content}],
        "ability": "char_class",
        "reward_model": {"style": "rule", "ground_truth": f"{name}:{DEFAULT_LENGTH}"},
    }


def evaluate(numbers: Sequence[int], operators: Sequence[str]) -> int:
    """Value of numbers[0] op numbers[1] op ... with * before + and - (no eval)."""
    terms = [numbers[0]]  # additive terms; * folds into the last one
    for op, value in zip(operators, numbers[1:]):
        if op == "*":
            terms[-1] *= value
        elif op == "+":
            terms.append(value)
        elif op == "-":
            terms.append(-value)
        else:
            raise ValueError(f"unsupported operator {op!r}")
    return sum(terms)


def make_arithmetic_row(rng: random.Random) -> dict[str, Any]:
    """One arithmetic example: 2-3 operands in 1..20 with + - *."""
    numbers = [rng.randint(1, 20) for _ in range(rng.choice((2, 3)))]
    operators = [rng.choice("+-*") for _ in numbers[1:]]
    expression = " ".join([str(numbers[0])] + [f"{op} {n}" for op, n in zip(operators, numbers[1:])])
    return {
        "data_source": ARITHMETIC_SOURCE,
        "prompt": [{"role": "user", "content": f"what is {expression}? end with #### and the answer."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(evaluate(numbers, operators))},
    }


_TOOL_VAULT_PROMPTS = ("what is the code?", "open the vault.", "tell me the code.", "find the code.")


def make_tool_vault_row(rng: random.Random) -> dict[str, Any]:
    """One tool_vault example: the code is drawn per conversation by the environment
    (workers/agent_tasks/vault.py), so the row holds no answer."""
    return {
        "data_source": TOOL_VAULT_SOURCE,
        "prompt": [{"role": "user", "content": rng.choice(_TOOL_VAULT_PROMPTS)}],
        "ability": "tool_use",
        "reward_model": {"style": "environment", "ground_truth": ""},
    }


def make_rows(
    size: int,
    split: str,
    seed: int,
    tasks: Sequence[str] = ("char_class",),
    char_classes: Sequence[str] = DEFAULT_CHAR_CLASSES,
) -> list[dict[str, Any]]:
    """`size` rows drawing the task uniformly from `tasks`; deterministic in (seed, split)."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown tasks {unknown or list(tasks)}; choose from {list(TASKS)}")
    bad_classes = [c for c in char_classes if c not in CHAR_CLASSES]
    if bad_classes or not char_classes:
        raise ValueError(
            f"unknown char classes {bad_classes or list(char_classes)}; choose from {sorted(CHAR_CLASSES)}"
        )
    makers: dict[str, Callable[[random.Random], dict[str, Any]]] = {
        "char_class": lambda r: make_char_class_row(r, char_classes),
        "arithmetic": make_arithmetic_row,
        "tool_vault": make_tool_vault_row,
        "visual_colors": make_visual_colors_row,
    }
    rng = random.Random(f"{seed}:{split}")  # str seeds are stable across processes
    rows = []
    for index in range(size):
        row = makers[rng.choice(list(tasks))](rng)
        row["extra_info"] = {"split": split, "index": index}
        if any(task in IMAGE_TASKS for task in tasks):
            row.setdefault(IMAGE_COLUMN, [])  # text rows of a mix with images: no picture
        rows.append(row)
    return rows


def write_synthetic_dataset(
    out_dir: str | Path,
    train_size: int = 1024,
    val_size: int = 128,
    seed: int = 0,
    tasks: Sequence[str] = ("char_class",),
    char_classes: Sequence[str] = DEFAULT_CHAR_CLASSES,
) -> tuple[Path, Path]:
    """Write OUT_DIR/train.parquet and OUT_DIR/val.parquet; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    schema = SCHEMA.append(pa.field(IMAGE_COLUMN, IMAGE_TYPE)) if any(t in IMAGE_TASKS for t in tasks) else SCHEMA
    paths = []
    for split, size in (("train", train_size), ("val", val_size)):
        rows = make_rows(size, split, seed, tasks, char_classes)
        path = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        paths.append(path)
    return paths[0], paths[1]


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--train-size", type=int, default=1024)
    parser.add_argument("--val-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=_csv, default=["char_class"], help=f"comma list from {list(TASKS)}")
    parser.add_argument(
        "--char-classes", type=_csv, default=list(DEFAULT_CHAR_CLASSES), help=f"comma list from {sorted(CHAR_CLASSES)}"
    )
    args = parser.parse_args(argv)
    train, val = write_synthetic_dataset(
        args.out_dir, args.train_size, args.val_size, args.seed, args.tasks, args.char_classes
    )
    print(f"wrote {train} ({args.train_size} rows) and {val} ({args.val_size} rows)")


if __name__ == "__main__":
    main()
