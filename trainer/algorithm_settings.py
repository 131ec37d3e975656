"""Checks of the DAPO settings the driver acts on: dynamic sampling (`algorithm.filter_groups`), the generation
batch size and the overlong penalty (`reward_model.overlong_buffer`, trainer/reward_settings.py). Free of torch:
the config loader imports it."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from trainer.algorithm_names import FILTER_GROUPS_METRICS
from trainer.critic_warmup import check_critic_warmup
from trainer.reward_settings import check_reward_settings, is_int

METRIC_MEANINGS = (
    "acc/score: the rule reward's score; seq_reward: the summed token scores; "
    "seq_final_reward: the summed token rewards"
)


def gen_batch_size(cfg: DictConfig) -> int:
    """Prompts per generation batch: data.gen_batch_size, or data.train_batch_size when it is null."""
    return cfg.data.get("gen_batch_size") or cfg.data.train_batch_size


def _check_filter_groups(cfg: DictConfig) -> list[str]:
    settings = cfg.algorithm.filter_groups
    key = "algorithm.filter_groups"
    if not isinstance(settings.enable, bool):
        return [f"{key}.enable={settings.enable!r} must be true or false"]
    problems = []
    if settings.enable and settings.metric not in FILTER_GROUPS_METRICS:
        problems.append(
            f"{key}.metric={settings.metric!r} is not valid; "
            f"choose one of {list(FILTER_GROUPS_METRICS)} ({METRIC_MEANINGS})"
        )
    cap = settings.max_num_gen_batches
    if not is_int(cap) or cap < 0:
        problems.append(
            f"{key}.max_num_gen_batches={cap!r} must be an integer >= 0 (0: no limit but one pass over the dataset)"
        )
    if not settings.enable or problems:
        return problems
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.n < 2:
        problems.append(
            f"{key}.enable=true compares the responses of a prompt: "
            f"set actor_rollout_ref.rollout.n >= 2 (got {rollout.n})"
        )
    if rollout.staleness != 0:
        problems.append(
            f"{key}.enable=true draws extra prompts within a step, which needs actor_rollout_ref.rollout.staleness=0 "
            f"(got {rollout.staleness}: the next batch would already be generating)"
        )
    if settings.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
        problems.append(
            f"{key}.metric=seq_final_reward with algorithm.use_kl_in_reward=true needs the reference log-probs before "
            "filtering, which are computed after it: use metric=seq_reward (the same without the KL term)"
        )
    per_batch = gen_batch_size(cfg)
    if cap > 0 and cap * per_batch < cfg.data.train_batch_size:
        problems.append(
            f"{key}.max_num_gen_batches={cap} batches of {per_batch} prompts (data.gen_batch_size) can never fill "
            f"data.train_batch_size={cfg.data.train_batch_size}: raise either"
        )
    return problems


def _check_gen_batch_size(cfg: DictConfig) -> list[str]:
    value = cfg.data.get("gen_batch_size")
    if value is None:
        return []
    if not is_int(value) or value < 1:
        return [f"data.gen_batch_size={value!r} must be null (data.train_batch_size) or a positive integer"]
    if value != cfg.data.train_batch_size and cfg.algorithm.filter_groups.enable is not True:
        return [
            f"data.gen_batch_size={value} differs from data.train_batch_size={cfg.data.train_batch_size}, which only "
            "algorithm.filter_groups.enable=true uses (more prompts generated than trained on); "
            "set it to null otherwise"
        ]
    return []


def check_algorithm_settings(cfg: DictConfig) -> list[str]:
    """Problems with algorithm.filter_groups, data.gen_batch_size and the reward manager with its overlong buffer
    (trainer/reward_settings.py; for the config validation: a recipe config without these sections has nothing
    to check)."""
    problems = []
    if OmegaConf.select(cfg, "algorithm.filter_groups") is not None:
        problems.extend(_check_filter_groups(cfg))
        problems.extend(_check_gen_batch_size(cfg))
    problems.extend(check_reward_settings(cfg))
    problems.extend(check_critic_warmup(cfg))  # trainer.critic_warmup needs a critic
    return problems
