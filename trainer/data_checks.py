"""Row checks of the training and validation files, run on the driver before Ray starts: the prompt column
holds chat messages, every `data_source` has a scorer, every row carries the ground truth the reward reads.

Column types come from the parquet schema; values are read with pyarrow, only the columns needed, batch by
batch, and checked with vectorised compute functions, so a file of millions of rows is checked in seconds.
The dataset's own row checks (trainer/data/rl_dataset.py) stay as the second line of defence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from omegaconf import DictConfig

from trainer.input_errors import InputError

BATCH_ROWS = 65_536
MESSAGE_FIELDS = ("role", "content")
REWARD_COLUMN = "reward_model"
SOURCE_COLUMN = "data_source"


@dataclass(frozen=True)
class RewardNeeds:
    """What the configured reward reads from each row."""

    scorers: frozenset[str] | None  # the data_source values it can score; None: any (your function, an environment)
    ground_truth_field: bool  # reward_model must be a dict with 'ground_truth' (the reward manager reads it)
    ground_truth_values: bool  # ... and hold a value (the built-in scorers compare the response with it)
    reward_model: bool = False  # a reward-model group adds its score to the rule score


def check_reward_function(path: str, name: str) -> None:
    """The configured `custom_reward_function` loads and is callable (it runs only from the path named)."""
    from trainer.rewards.loader import load_reward_function

    try:
        load_reward_function(path, name)
    except AttributeError as error:
        raise InputError(f"custom_reward_function.path={path!r}: {error} (set custom_reward_function.name)") from None
    except (FileNotFoundError, TypeError, ValueError) as error:
        raise InputError(f"custom_reward_function.path={path!r}: {error}") from None
    except Exception as error:  # noqa: BLE001 - the user's module failed to import: say how
        raise InputError(
            f"custom_reward_function.path={path!r}: loading it failed: {type(error).__name__}: {error}"
        ) from None


def reward_needs(cfg: DictConfig) -> RewardNeeds:
    """What the reward of `cfg` reads from the rows; loads and checks a custom reward function on the way."""
    custom = cfg.custom_reward_function
    if custom.path:
        check_reward_function(custom.path, custom.name)
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if multi_turn.enable and multi_turn.environment:  # the environment scores its episodes; rows may carry nothing
        return RewardNeeds(None, ground_truth_field=False, ground_truth_values=False)
    if custom.path:
        return RewardNeeds(None, ground_truth_field=True, ground_truth_values=False)
    from trainer.rewards.registry import SCORERS

    return RewardNeeds(frozenset(SCORERS), True, True, reward_model=bool(cfg.reward_model.enable))


def _first(mask: Any) -> int | None:
    """The index of the first true value of a boolean array (nulls count as false), or None."""
    index = pc.index(pc.fill_null(mask, False), True).as_py()
    return None if index < 0 else index


def _is_messages(kind: pa.DataType) -> bool:
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    return listed and pa.types.is_struct(kind.value_type) and all(
        kind.value_type.get_field_index(name) >= 0 for name in MESSAGE_FIELDS
    )


def _prompt_type_problem(file: Path, prompt_key: str, kind: pa.DataType) -> str | None:
    if _is_messages(kind):
        return None
    first = next(pq.ParquetFile(file).iter_batches(batch_size=1, columns=[prompt_key])).column(0)[0].as_py()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        held = f"a plain string ({first[:60]!r})" if isinstance(first, str) else "plain strings"
        example = json.dumps([{"role": "user", "content": first if isinstance(first, str) else "..."}])[:120]
    else:
        held, example = f"{str(first)[:60]} (type {kind})", '[{"role": "user", "content": "..."}]'
    return (
        f"row 0: column {prompt_key!r} holds {held}, not chat messages; store each prompt as a list of "
        f"{{role, content}} messages, e.g. {example}"
    )


def _prompt_row_problem(column: Any, offset: int, prompt_key: str) -> str | None:
    row = _first(column.is_null())
    if row is not None:
        return f"row {offset + row}: column {prompt_key!r} is empty (null); every row needs its chat messages"
    row = _first(pc.equal(pc.list_value_length(column), 0))
    if row is not None:
        return f"row {offset + row}: column {prompt_key!r} holds no messages ([]); every row needs its chat messages"
    messages = pc.list_flatten(column)
    bad = pc.or_(messages.is_null(), pc.struct_field(messages, "role").is_null())
    at = _first(bad)
    if at is not None:
        row = pc.list_parent_indices(column)[at].as_py()
        return f"row {offset + row}: a message of column {prompt_key!r} has no role; each message is {{role, content}}"
    return None


def _reward_type_problem(kind: pa.DataType) -> str | None:
    if not pa.types.is_struct(kind):
        return (f"row 0: column {REWARD_COLUMN!r} holds {kind}, not a dict; the reward reads "
                f"{REWARD_COLUMN}['ground_truth']: store each row's answer as {{\"ground_truth\": ...}}")
    if kind.get_field_index("ground_truth") < 0:
        fields = [kind.field(i).name for i in range(kind.num_fields)]
        return (f"row 0: column {REWARD_COLUMN!r} has no 'ground_truth' field (fields: {fields}); the reward reads "
                f"{REWARD_COLUMN}['ground_truth']: store each row's answer there")
    return None


def _reward_row_problem(column: Any, offset: int, values: bool) -> str | None:
    row = _first(column.is_null())
    if row is not None:
        return f"row {offset + row}: column {REWARD_COLUMN!r} is empty (null); it must be a dict with 'ground_truth'"
    if values:
        row = _first(pc.struct_field(column, "ground_truth").is_null())
        if row is not None:
            return (f"row {offset + row}: {REWARD_COLUMN}['ground_truth'] is empty (null); the built-in scorers "
                    "compare the response with it")
    return None


def _source_problem(column: Any, offset: int, needs: RewardNeeds) -> str | None:
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    for source in pc.unique(column).to_pylist():
        if source in needs.scorers:
            continue
        row = _first(column.is_null()) if source is None else pc.index(column, source).as_py()
        model = (" (the reward model's score is added to the rule score; a compute_score returning 0.0 uses the "
                 "model alone)") if needs.reward_model else ""
        return (
            f"row {offset + row}: data_source {source!r} has no built-in scorer (known: {sorted(needs.scorers)}); set "
            "custom_reward_function.path to a .py file whose compute_score(data_source, solution_str, ground_truth, "
            f"extra_info) scores it{model}"
        )
    return None


def check_file_rows(file: str | Path, key: str, prompt_key: str, needs: RewardNeeds) -> None:
    """One parquet file (whose columns are already checked); raises InputError naming the file and the row."""
    parquet = pq.ParquetFile(file)
    if parquet.metadata.num_rows == 0:
        raise InputError(f"{key}: parquet file {file} has no rows")
    schema = parquet.schema_arrow
    problem = _prompt_type_problem(Path(file), prompt_key, schema.field(prompt_key).type)
    if problem is None and needs.ground_truth_field:
        problem = _reward_type_problem(schema.field(REWARD_COLUMN).type)
    columns = [prompt_key] + ([SOURCE_COLUMN] if needs.scorers is not None else [])
    columns += [REWARD_COLUMN] if needs.ground_truth_field else []
    offset = 0
    batches = parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns) if problem is None else iter(())
    for batch in batches:
        problem = _prompt_row_problem(batch.column(prompt_key), offset, prompt_key)
        if problem is None and needs.scorers is not None:
            problem = _source_problem(batch.column(SOURCE_COLUMN), offset, needs)
        if problem is None and needs.ground_truth_field:
            problem = _reward_row_problem(batch.column(REWARD_COLUMN), offset, needs.ground_truth_values)
        if problem:
            break
        offset += batch.num_rows
    if problem:
        raise InputError(f"{key}: {file} {problem}")


def check_rows(files: Any, key: str, prompt_key: str, needs: RewardNeeds) -> None:
    """Every file of `files` (one path or a list, as `data.train_files` / `data.val_files` take them)."""
    for file in [files] if isinstance(files, (str, Path)) else list(files):
        check_file_rows(file, key, prompt_key, needs)
