"""A batch that does not split over the workers stops before Ray with one `error:` line (exit code 2) in the
settings the user set; the driver's check agrees with the workers' own assertions case by case."""

from __future__ import annotations

import itertools

import pytest

from tests.reliability.conftest import error_lines, short_run
from trainer.batch_checks import batch_split_problems
from trainer.config_loader import load_config
from trainer.main import main
from trainer.role_groups import actor_worker_config, critic_worker_config
from workers.config import mini_batch_per_rank
from workers.megatron.parallel import megatron_mesh_shape


def test_three_workers_and_64_responses_per_mini_batch(no_ray, small_assets, tmp_path, capsys):
    """The case of the issue: 8 prompts x 8 responses per mini-batch over 3 workers."""
    assert main(short_run(small_assets, tmp_path, "trainer.n_gpus_per_node=3")) == 2
    assert error_lines(capsys) == [
        "error: actor_rollout_ref.actor.ppo_mini_batch_size=8 prompts × actor_rollout_ref.rollout.n=8 = 64 responses per "
        "mini-batch do not split over trainer.n_gpus_per_node=3 × trainer.nnodes=1 = 3 workers; use a worker count that "
        "divides them (1, 2, 4, 8, 16, 32, ...) or change data.train_batch_size, actor_rollout_ref.actor.ppo_mini_batch_size "
        "or actor_rollout_ref.rollout.n so that the responses per mini-batch are a multiple of 3"
    ]


def test_the_critic_mini_batch_is_checked_and_a_fitting_size_is_suggested(no_ray, small_assets, tmp_path, capsys):
    assert main(short_run(small_assets, tmp_path, "algorithm=ppo", "critic.ppo_mini_batch_size=3")) == 2
    assert error_lines(capsys) == [
        "error: critic.ppo_mini_batch_size=3 prompts × actor_rollout_ref.rollout.n=1 = 3 responses per mini-batch do not "
        "split over trainer.n_gpus_per_node=2 × trainer.nnodes=1 = 2 workers; use a worker count that divides them (1, 3) "
        "or set critic.ppo_mini_batch_size to one of [2, 4, 8, 16] (prompts that divide data.train_batch_size=16 and whose "
        "responses split over 2)"
    ]


def test_a_token_budget_below_the_longest_sequence(no_ray, small_assets, tmp_path, capsys):
    overrides = ("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40")
    assert main(short_run(small_assets, tmp_path, *overrides)) == 2
    assert error_lines(capsys) == [
        "error: actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40 (actor_rollout_ref.actor.use_dynamic_bsz=true) is "
        "smaller than the longest sequence: data.max_prompt_length=64 + data.max_response_length=8 = 72 tokens; raise it "
        "to at least 72"
    ]


MEGATRON = "actor_rollout_ref.actor.strategy=megatron"


@pytest.mark.parametrize(("overrides", "expected"), [
    ((MEGATRON, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=3"),
     "error: trainer.n_gpus_per_node=3 × trainer.nnodes=1 = 3 workers cannot be split into model copies of "
     "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 × pipeline_model_parallel_size=1 = 2 ranks each; "
     "use a worker count that is a multiple of 2, or smaller parallel sizes"),
    ((MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", "trainer.n_gpus_per_node=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.rollout.n=3"),
     "error: actor_rollout_ref.actor.ppo_mini_batch_size=1 prompts × actor_rollout_ref.rollout.n=3 = 3 responses per "
     "mini-batch do not split over trainer.n_gpus_per_node=4 × trainer.nnodes=1 = 4 workers ÷ "
     "(actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1 × pipeline_model_parallel_size=2 = 2) = 2 "
     "data-parallel ranks; use a worker count that divides them (2, 6)"),
    ((MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3", "trainer.n_gpus_per_node=3"),
     "error: actor_rollout_ref.actor.megatron (tensor_model_parallel_size=1, pipeline_model_parallel_size=3) with "
     "actor_rollout_ref.model.path="),
    (("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=4"),
     "error: actor_rollout_ref.rollout.tensor_model_parallel_size=4 cannot split the model's 2 attention heads (1 "
     "key/value heads) of actor_rollout_ref.model.path="),
    ((MEGATRON, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2", "trainer.n_gpus_per_node=2"),
     "error: actor_rollout_ref.actor.megatron (tensor_model_parallel_size=1, pipeline_model_parallel_size=1, "
     "expert_model_parallel_size=2) with actor_rollout_ref.model.path="),
    ((MEGATRON, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2", "trainer.n_gpus_per_node=3"),
     "error: actor_rollout_ref.actor.megatron.expert_model_parallel_size=2 must divide the 3 data-parallel ranks"),
    ((MEGATRON, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2",
      "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
      "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4"),
     "error: actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 must divide 2 (the 2 ranks of a pipeline "
     "stage (trainer.n_gpus_per_node=2 × trainer.nnodes=1 = 2 workers ÷ pipeline_model_parallel_size=1) ÷ "
     "expert_tensor_parallel_size=1); use one of 1, 2"),
], ids=["megatron_tp_vs_workers", "megatron_data_parallel_ranks", "megatron_pp_vs_layers", "vllm_tp_vs_heads",
        "megatron_ep_on_a_dense_model", "megatron_ep_vs_data_parallel_ranks", "megatron_folded_ep_vs_stage_ranks"])
def test_model_parallel_sizes(no_ray, small_assets, tmp_path, capsys, overrides, expected):
    assert main(short_run(small_assets, tmp_path, *overrides)) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_settings_that_split_pass(small_assets, tmp_path):
    pipeline_of_two = (MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                       "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                       "actor_rollout_ref.rollout.n=3")
    for overrides in ((), ("trainer.n_gpus_per_node=4",), ("algorithm=ppo", "trainer.n_gpus_per_node=1"), pipeline_of_two):
        assert batch_split_problems(load_config(short_run(small_assets, tmp_path, *overrides))) == [], overrides


def _worker_refuses(section: dict, responses_per_prompt: int, ranks: int) -> bool:
    """Whether a worker given `section` (its config as the driver sends it) refuses its mini-batch."""
    try:
        mini_batch_per_rank(section, responses_per_prompt, ranks, "x")
    except ValueError:
        return True
    return False


def test_the_driver_check_agrees_with_the_workers_assertions(small_assets, tmp_path):
    """Over a grid of batch sizes, responses per prompt and worker counts (FSDP and Megatron), the driver
    reports a problem exactly when an actor or critic worker would refuse its mini-batch or mesh."""
    base = load_config(short_run(small_assets, tmp_path, "algorithm=ppo"))
    outcomes = []
    for train, mini, n, workers, tp in itertools.product((8, 12), (1, 2, 4, 6), (1, 2, 3, 8), (1, 2, 3, 4, 6), (1, 2)):
        if train % mini:
            continue
        cfg = base  # every value the check reads is set below
        cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size = train, mini
        cfg.critic.ppo_mini_batch_size, cfg.actor_rollout_ref.rollout.n, cfg.critic.rollout_n = mini, n, n
        cfg.trainer.n_gpus_per_node = workers
        cfg.actor_rollout_ref.actor.strategy = "megatron" if tp > 1 else "fsdp"
        cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size = tp
        try:
            dp = megatron_mesh_shape(workers, tp, 1)["dp"]
            actor = actor_worker_config(cfg)
            refused = _worker_refuses(actor["actor"], actor["rollout"]["n"], dp)
            critic = critic_worker_config(cfg)
            refused = refused or _worker_refuses(critic, critic["rollout_n"], workers)
        except ValueError:
            refused = True
        problems = [p for p in batch_split_problems(cfg) if "megatron (" not in p]  # the model layout is checked apart
        assert bool(problems) == refused, (train, mini, n, workers, tp, problems)
        outcomes.append(refused)
    assert len(outcomes) > 200 and 0.2 < sum(outcomes) / len(outcomes) < 0.8  # both outcomes, often
