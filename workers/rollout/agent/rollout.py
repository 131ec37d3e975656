"""`AgentRollout`: the multi-turn rollout of one worker, built from `rollout.multi_turn`.

Workers call `run(prompts, samples, generator, call_seed, rank)` in place of their single-turn generate;
the result has the usual rollout keys plus the agent's per-sample counts (see `batch.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.rollout.agent.batch import conversation_batch
from workers.rollout.agent.chat import ChatBridge
from workers.rollout.agent.engines import turn_seed
from workers.rollout.agent.environment import Environment, ToolEnvironment
from workers.rollout.agent.loop import AgentLoop, AgentSettings, TurnGenerator
from workers.rollout.agent.parsers import make_parser
from workers.rollout.agent.tools import ToolLimits, load_object, load_tools
from workers.rollout.sampling import SamplingParams

SAMPLE_KEYS = ("data_source", "reward_model", "extra_info", "index")


def absolute_specs(multi_turn: dict[str, Any]) -> dict[str, Any]:
    """Tool and environment file paths made absolute where the config is read (the driver), since the
    workers may run in another directory."""

    def absolute(spec: str) -> str:
        path, sep, name = spec.rpartition(":")
        return f"{Path(path).expanduser().resolve()}{sep}{name}" if path.endswith(".py") else spec

    out = dict(multi_turn)
    out["tools"] = [absolute(s) for s in multi_turn.get("tools") or []]
    if multi_turn.get("environment"):
        out["environment"] = absolute(multi_turn["environment"])
    return out


def environment_factory(multi_turn: dict[str, Any]) -> Callable[[], Environment]:
    if multi_turn["environment"] and multi_turn["tools"]:
        raise ValueError(
            "rollout.multi_turn: set either `environment` or `tools`, not both (an environment serves its own tools)"
        )
    if multi_turn["environment"]:
        env_class = load_object(multi_turn["environment"], "environment")
        if not (isinstance(env_class, type) and issubclass(env_class, Environment)):
            raise TypeError(
                f"environment {multi_turn['environment']!r} must be a subclass of workers.rollout.agent.Environment"
            )
        return env_class
    if not multi_turn["tools"]:
        raise ValueError(
            "rollout.multi_turn.enable=true needs `tools` (['path/to/file.py:function', ...]) or `environment`"
        )
    tools = load_tools(multi_turn["tools"])
    return lambda: ToolEnvironment(tools)


class AgentRollout:
    def __init__(
        self, multi_turn: dict[str, Any], tokenizer: Any, response_length: int, eos_token_ids: tuple[int, ...]
    ) -> None:
        self.cfg = multi_turn
        self.new_environment = environment_factory(multi_turn)
        self.parser = make_parser(multi_turn["format"])
        self.bridge = ChatBridge(tokenizer, eos_token_ids, multi_turn["tool_role"])
        self.settings = AgentSettings(
            response_length=response_length,
            max_turns=multi_turn["max_turns"],
            max_tokens_per_turn=multi_turn["max_tokens_per_turn"] or response_length,
            limits=ToolLimits(multi_turn["tool_timeout_s"], multi_turn["tool_max_output_chars"]),
        )

    def run(
        self,
        prompts: dict[str, torch.Tensor],
        samples: list[dict[str, Any]],
        generator: TurnGenerator,
        params: SamplingParams,
        call_seed: int | None,
        rank: int,
    ) -> dict[str, torch.Tensor]:
        ids, mask = prompts["input_ids"], prompts["attention_mask"].bool()
        contexts = [row[m].tolist() for row, m in zip(ids, mask)]
        envs = []
        for row, sample in enumerate(samples):
            env = self.new_environment()
            env.reset(sample, seed=turn_seed(call_seed or 0, rank, row, turn=0))
            envs.append(env)
        conversations = AgentLoop(generator, self.parser, self.bridge, self.settings).run(contexts, envs)
        return conversation_batch(
            {k: v.cpu() for k, v in prompts.items()}, conversations, self.settings.response_length, params.pad_token_id
        )


def sample_fields(non_tensor_batch: dict[str, np.ndarray], rows: int) -> list[dict[str, Any]]:
    """Per row, the non-tensor fields an environment may read."""
    present = [k for k in SAMPLE_KEYS if k in non_tensor_batch]
    return [{k: non_tensor_batch[k][i] for k in present} for i in range(rows)]
