"""How a step's batch is split over the worker ranks, checked before Ray starts.

The workers assert each of these when they start or at their first update (workers/config.py
`mini_batch_per_rank`, workers/megatron/parallel.py, workers/megatron/layout.py, workers/fsdp/ulysses.py, the
token budgets of workers/packing/token_budget.py), in worker-side numbers: `ppo_mini_batch_size=64` is
prompts × rollout.n, a number the user never typed. Here every problem is reported in the settings the user
set. Micro-batch row counts need no check: a mini-batch's last micro-batch may be smaller (Megatron's pipeline
included).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.input_errors import InputError

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
SHOWN_DIVISORS = 6  # worker counts suggested in a message before "..."


@dataclass(frozen=True)
class Ranks:
    """The data-parallel ranks of one role, and how the message names them."""

    count: int
    described: str


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default)


def _workers(cfg: DictConfig) -> tuple[int, str]:
    per_node, nodes = cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes
    count = per_node * nodes
    return count, f"trainer.n_gpus_per_node={per_node} × trainer.nnodes={nodes} = {count} workers"


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def _listed(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:SHOWN_DIVISORS]))
    return shown + (", ..." if len(numbers) > SHOWN_DIVISORS else "")


def sequence_parallel_size(cfg: DictConfig, section: str) -> int:
    """Ulysses: the ranks that share each sequence of `section` (actor_rollout_ref.actor or critic)."""
    return int(_get(cfg, f"{section}.ulysses_sequence_parallel_size", 1) or 1)


def data_parallel_ranks(cfg: DictConfig, section: str, strategy: str) -> tuple[Ranks | None, str | None]:
    """The data-parallel ranks of a role trained with `strategy` (megatron: workers ÷ (TP × PP); fsdp:
    workers ÷ the Ulysses size), or the problem when its parallel sizes do not divide the workers."""
    workers, described = _workers(cfg)
    if strategy != "megatron":
        size = sequence_parallel_size(cfg, section)
        if size == 1:
            return Ranks(workers, described), None
        key = f"{section}.ulysses_sequence_parallel_size={size}"
        if workers % size:
            fitting = _listed([d for d in _divisors(workers) if d > 1])
            return None, (
                f"{described} cannot be split into sequence-parallel groups of {key} ranks; use a worker count that is "
                f"a multiple of {size}, or a size that divides {workers} ({fitting or 1})"
            )
        return Ranks(workers // size, f"{described} ÷ {key} = {workers // size} data-parallel groups"), None
    tp = _get(cfg, f"{section}.megatron.tensor_model_parallel_size", 1)
    pp = _get(cfg, f"{section}.megatron.pipeline_model_parallel_size", 1)
    per_copy = tp * pp
    sizes = f"{section}.megatron.tensor_model_parallel_size={tp} × pipeline_model_parallel_size={pp} = {per_copy}"
    if workers % per_copy:
        return None, (
            f"{described} cannot be split into model copies of {sizes} ranks each; use a worker count that is a "
            f"multiple of {per_copy}, or smaller parallel sizes"
        )
    ep = _get(cfg, f"{section}.megatron.expert_model_parallel_size", 1) or 1
    etp = _get(cfg, f"{section}.megatron.expert_tensor_parallel_size", None)
    if etp is None or etp == tp:
        if (workers // per_copy) % ep:
            return None, (
                f"{section}.megatron.expert_model_parallel_size={ep} must divide the {workers // per_copy} "
                f"data-parallel ranks ({described} ÷ ({sizes})); use one of {_listed(_divisors(workers // per_copy))}"
            )
    else:
        # Parallel folding: the experts lay a stage's TP x DP ranks out again as expert TP x EP x expert DP.
        stage_ranks, stage = workers // pp, f"{described} ÷ pipeline_model_parallel_size={pp}"
        if stage_ranks % etp:
            return None, (
                f"{section}.megatron.expert_tensor_parallel_size={etp} must divide the {stage_ranks} ranks of a "
                f"pipeline stage ({stage}); use one of {_listed(_divisors(stage_ranks))}"
            )
        if (stage_ranks // etp) % ep:
            return None, (
                f"{section}.megatron.expert_model_parallel_size={ep} must divide {stage_ranks // etp} (the "
                f"{stage_ranks} ranks of a pipeline stage ({stage}) ÷ expert_tensor_parallel_size={etp}); use one of "
                f"{_listed(_divisors(stage_ranks // etp))}"
            )
    return Ranks(workers // per_copy, f"{described} ÷ ({sizes}) = {workers // per_copy} data-parallel ranks"), None


def mini_batch_problem(cfg: DictConfig, section: str, ranks: Ranks) -> str | None:
    """`<section>.ppo_mini_batch_size` prompts × rollout.n responses must split evenly over the ranks."""
    prompts = _get(cfg, f"{section}.ppo_mini_batch_size")
    n = cfg.actor_rollout_ref.rollout.n
    responses = prompts * n
    if responses % ranks.count == 0:
        return None
    train = cfg.data.train_batch_size
    fitting = [p for p in _divisors(train) if p * n % ranks.count == 0]
    ranks_per_copy = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes // ranks.count  # Megatron: TP x PP
    worker_counts = [d * ranks_per_copy for d in _divisors(responses)]
    change = (
        f"set {section}.ppo_mini_batch_size to one of {fitting} (prompts that divide data.train_batch_size={train} "
        f"and whose responses split over {ranks.count})"
        if fitting
        else f"change data.train_batch_size, {section}.ppo_mini_batch_size or {ROLLOUT}.n so that the responses per "
        f"mini-batch are a multiple of {ranks.count}"
    )
    return (
        f"{section}.ppo_mini_batch_size={prompts} prompts × {ROLLOUT}.n={n} = {responses} responses per mini-batch do "
        f"not split over {ranks.described}; use a worker count that divides them ({_listed(worker_counts)}) or {change}"
    )


def _token_budgets(cfg: DictConfig, uses_critic: bool) -> list[tuple[str, str, str | None]]:
    """(switch, budget, sequence-parallel section) of the token-budget micro-batches the run's roles use: a
    budget is per GPU, and the ranks of a sequence-parallel group share a micro-batch."""
    ref, reward_model = "actor_rollout_ref.ref", "reward_model"
    budgets: list[tuple[str, str, str | None]] = [
        (f"{ACTOR}.use_dynamic_bsz", f"{ACTOR}.ppo_max_token_len_per_gpu", ACTOR),
        (f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu", ACTOR),
    ]
    if _get(cfg, f"{ACTOR}.use_kl_loss") or _get(cfg, "algorithm.use_kl_in_reward"):
        budgets.append((f"{ref}.log_prob_use_dynamic_bsz", f"{ref}.log_prob_max_token_len_per_gpu", ACTOR))
    if uses_critic:
        budgets.append(("critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu", "critic"))
        budgets.append(("critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu", "critic"))
    if _get(cfg, f"{reward_model}.enable"):
        budgets.append((f"{reward_model}.use_dynamic_bsz", f"{reward_model}.forward_max_token_len_per_gpu", None))
    return budgets


def token_budget_problems(cfg: DictConfig, uses_critic: bool) -> list[str]:
    """A token budget (x the ranks sharing a sequence) must hold the longest sequence the run can make."""
    prompt, response = cfg.data.max_prompt_length, cfg.data.max_response_length
    longest = prompt + response
    problems = []
    for switch, budget_key, sharing in _token_budgets(cfg, uses_critic):
        budget = _get(cfg, budget_key)
        size = sequence_parallel_size(cfg, sharing) if sharing else 1
        if _get(cfg, switch) is not True or not isinstance(budget, int) or budget * size >= longest:
            continue
        if size == 1:
            problems.append(
                f"{budget_key}={budget} ({switch}=true) is smaller than the longest sequence: data.max_prompt_length="
                f"{prompt} + data.max_response_length={response} = {longest} tokens; raise it to at least {longest}"
            )
        else:
            problems.append(
                f"{budget_key}={budget} × {sharing}.ulysses_sequence_parallel_size={size} ({switch}=true) is smaller "
                f"than the longest sequence: data.max_prompt_length={prompt} + data.max_response_length={response} = "
                f"{longest} tokens; raise it to at least {math.ceil(longest / size)}"
            )
    return problems


def _model_config(path: str) -> dict[str, Any] | None:
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # the model folder check names a missing or unreadable config.json


def megatron_layout_problem(cfg: DictConfig, section: str, model_key: str) -> str | None:
    """TP and PP must split the model's heads, MLP and layers, EP its experts (workers/megatron/layout.py)."""
    from transformers import AutoConfig

    from workers.megatron.layout import layout_from_hf_config
    from workers.megatron.moe import moe_sequence_parallel_problem

    path = _get(cfg, model_key)
    tp = _get(cfg, f"{section}.megatron.tensor_model_parallel_size", 1)
    pp = _get(cfg, f"{section}.megatron.pipeline_model_parallel_size", 1)
    ep = _get(cfg, f"{section}.megatron.expert_model_parallel_size", 1) or 1
    etp = _get(cfg, f"{section}.megatron.expert_tensor_parallel_size", None)
    sizes = f"tensor_model_parallel_size={tp}, pipeline_model_parallel_size={pp}" + (
        f", expert_model_parallel_size={ep}" if ep != 1 else ""
    ) + (f", expert_tensor_parallel_size={etp}" if etp is not None and etp != tp else "")
    try:
        layout = layout_from_hf_config(AutoConfig.from_pretrained(path), tp=tp, pp=pp, ep=ep, etp=etp)
    except ValueError as error:
        reasons = str(error).replace(":\n  ", ": ", 1).replace("\n  ", "; ")
        return f"{section}.megatron ({sizes}) with {model_key}={path!r}: {reasons}"
    switch = f"{section}.megatron.sequence_parallel"
    problem = moe_sequence_parallel_problem(layout.moe, tp, bool(_get(cfg, switch)), switch)
    return None if problem is None else f"{section}.megatron ({sizes}) with {model_key}={path!r}: {problem}"


def _language_config(path: str) -> dict[str, Any] | None:
    """The language model's fields of a folder's config.json (a vision-language model's text_config)."""
    from trainer.memory_plan.shape import language_model_config

    model = _model_config(path)
    return None if model is None else language_model_config(model)


def sequence_parallel_vision_problem(cfg: DictConfig, section: str, model_key: str) -> str | None:
    """Ulysses splits each sequence's tokens over a group of ranks, but not the vision tower's image embeddings
    (workers/packing/forward.py refuses image inputs under it): a vision-language model trains with size 1."""
    from workers.vision.models import is_vision_language

    size = sequence_parallel_size(cfg, section)
    model = _model_config(_get(cfg, model_key)) if size > 1 else None
    if model is None or not is_vision_language(model):
        return None
    key = f"{section}.ulysses_sequence_parallel_size"
    return (
        f"{key}={size} with a vision-language model ({model_key}={_get(cfg, model_key)!r} has a vision_config): "
        f"sequence parallelism does not split image inputs; set {key}=1, or use a text-only model"
    )


def sequence_parallel_heads_problem(cfg: DictConfig, section: str, model_key: str) -> str | None:
    """Ulysses splits the attention heads over the ranks of a sequence-parallel group."""
    size = sequence_parallel_size(cfg, section)
    model = _language_config(_get(cfg, model_key)) if size > 1 else None
    if model is None or "num_attention_heads" not in model:
        return None
    from workers.packing.ulysses import check_heads

    heads = model["num_attention_heads"]
    try:
        check_heads(heads, model.get("num_key_value_heads") or heads, size, f"{section}.ulysses_sequence_parallel_size")
    except ValueError as error:
        return f"{error} ({model_key}={_get(cfg, model_key)!r})"
    return None


def rollout_tp_problem(cfg: DictConfig) -> str | None:
    """vLLM shards attention heads over its tensor-parallel ranks (key/value heads may be replicated)."""
    tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    model = _language_config(cfg.actor_rollout_ref.model.path) if tp > 1 else None
    if model is None or "num_attention_heads" not in model:
        return None
    heads = model["num_attention_heads"]
    kv_heads = model.get("num_key_value_heads") or heads
    if heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0):
        return None
    valid = [t for t in _divisors(heads) if kv_heads % t == 0 or t % kv_heads == 0]
    return (
        f"{ROLLOUT}.tensor_model_parallel_size={tp} cannot split the model's {heads} attention heads ({kv_heads} "
        f"key/value heads) of actor_rollout_ref.model.path={cfg.actor_rollout_ref.model.path!r}; valid sizes: {valid}"
    )


def batch_split_problems(cfg: DictConfig) -> list[str]:
    """Every way the configured batch, worker counts and parallel sizes would fail in the workers."""
    uses_critic = _get(cfg, "algorithm.adv_estimator") == "gae"
    roles = [(ACTOR, _get(cfg, f"{ACTOR}.strategy", "fsdp"), "actor_rollout_ref.model.path")]
    if uses_critic:
        roles.append(("critic", _get(cfg, "critic.strategy", "fsdp"), "critic.model.path"))
    problems = []
    for section, strategy, model_key in roles:
        ranks, problem = data_parallel_ranks(cfg, section, strategy)
        if problem:
            problems.append(problem)
            continue
        if strategy == "megatron":
            problems.append(megatron_layout_problem(cfg, section, model_key))
        else:
            problems.append(
                sequence_parallel_vision_problem(cfg, section, model_key)
                or sequence_parallel_heads_problem(cfg, section, model_key)
            )
        problems.append(mini_batch_problem(cfg, section, ranks))
    problems += token_budget_problems(cfg, uses_critic)
    problems.append(rollout_tp_problem(cfg))
    return [problem for problem in problems if problem]


def check_batch_split(cfg: DictConfig) -> None:
    """InputError (one line, every problem) when the batch cannot be split as configured."""
    problems = batch_split_problems(cfg)
    if problems:
        raise InputError("; and ".join(problems))
