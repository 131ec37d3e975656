"""Step metrics of a multi-turn rollout, from the per-sample counts the agent loop puts in the batch."""

from __future__ import annotations

from typing import Any


def agent_metrics(batch: Any) -> dict[str, float]:
    """`agent/*` means over the batch; {} for a single-turn rollout."""
    if "num_turns" not in batch.keys():
        return {}
    calls = batch["num_tool_calls"].float()
    errors = batch["num_tool_errors"].float()
    return {
        "agent/turns_mean": float(batch["num_turns"].float().mean()),
        "agent/tool_calls_mean": float(calls.mean()),
        "agent/tool_use_rate": float((calls > 0).float().mean()),
        "agent/tool_errors_mean": float(errors.mean()),
        "agent/tool_error_rate": float(errors.sum() / calls.sum()) if calls.sum() > 0 else 0.0,
        "agent/tool_timeouts": float(batch["num_tool_timeouts"].sum()),
        "agent/tool_outputs_cut": float(batch["num_outputs_cut"].sum()),
        "agent/truncated_rate": float(batch["truncated"].float().mean()),
        "agent/max_turns_rate": float(batch["hit_max_turns"].float().mean()),
        "agent/model_tokens_mean": float(batch["response_mask"].sum(-1).float().mean()),
        "agent/tool_tokens_mean": float(
            (batch["attention_mask"][:, -batch["responses"].shape[1] :].sum(-1) - batch["response_mask"].sum(-1))
            .float()
            .mean()
        ),
    }
