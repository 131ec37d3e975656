"""Ulysses settings the workers would refuse stop before Ray with one `error:` line (exit code 2), named in
the user's settings: a size that does not divide the workers or the model's heads, padded forwards, a
reference size unlike the actor's, a token budget that the group's GPUs together cannot fill with one sequence,
a vision-language model (whose image inputs are not split over the group)."""

from __future__ import annotations

import pytest

from tests.reliability.conftest import error_lines, short_run
from trainer.batch_checks import batch_split_problems, rollout_tp_problem
from trainer.config_loader import load_config
from trainer.main import main

SP = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


@pytest.mark.parametrize(("overrides", "expected"), [
    ((f"{SP}=2", "trainer.n_gpus_per_node=3"),
     "error: trainer.n_gpus_per_node=3 × trainer.nnodes=1 = 3 workers cannot be split into sequence-parallel "
     f"groups of {SP}=2 ranks; use a worker count that is a multiple of 2, or a size that divides 3 (3)"),
    ((f"{SP}=4", "trainer.n_gpus_per_node=4"),
     f"error: {SP}=4 cannot split the model's 2 attention heads (1 key/value heads) over 4 ranks: it must divide the "
     "attention heads, and divide the key/value heads or be a multiple of them; valid sizes: [1, 2] "
     "(actor_rollout_ref.model.path="),
    ((f"{SP}=2", "actor_rollout_ref.model.use_remove_padding=false"),
     f"error: {SP}=2 splits packed (padding-free) sequences, but actor_rollout_ref.model.use_remove_padding=false runs "
     "padded forwards; set use_remove_padding to null or true, or the sequence-parallel size to 1"),
    ((f"{SP}=2", "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1"),
     f"error: actor_rollout_ref.ref.ulysses_sequence_parallel_size=1 differs from {SP}=2: the reference runs in the "
     "actor's worker group"),
    ((f"{SP}=2", "actor_rollout_ref.actor.use_dynamic_bsz=true",
      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30"),
     f"error: actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30 × {SP}=2 (actor_rollout_ref.actor.use_dynamic_bsz="
     "true) is smaller than the longest sequence: data.max_prompt_length=64 + data.max_response_length=8 = 72 tokens; "
     "raise it to at least 36"),
    (("algorithm=ppo", "critic.ulysses_sequence_parallel_size=2", "trainer.n_gpus_per_node=4",
      "critic.ppo_mini_batch_size=1"),
     "error: critic.ppo_mini_batch_size=1 prompts × actor_rollout_ref.rollout.n=1 = 1 responses per mini-batch do not "
     "split over trainer.n_gpus_per_node=4 × trainer.nnodes=1 = 4 workers ÷ critic.ulysses_sequence_parallel_size=2 "
     "= 2 data-parallel groups"),
], ids=["workers", "heads", "padded", "reference", "token_budget", "critic_mini_batch"])
def test_ulysses_settings_fail_before_ray(no_ray, small_assets, tmp_path, capsys, overrides, expected):
    assert main(short_run(small_assets, tmp_path, *overrides)) == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_ulysses_settings_that_split_pass(small_assets, tmp_path):
    fitting = (
        (f"{SP}=2",),
        (f"{SP}=2", "trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.use_dynamic_bsz=true",
         "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=36"),  # 2 x 36 holds the 72-token sequence
        ("algorithm=ppo", "critic.ulysses_sequence_parallel_size=2"),
    )
    for overrides in fitting:
        assert batch_split_problems(load_config(short_run(small_assets, tmp_path, *overrides))) == [], overrides


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory) -> str:
    from trainer.tiny_vlm import build_tiny_vlm

    return str(build_tiny_vlm(tmp_path_factory.mktemp("ulysses_vlm")))


def test_a_vision_language_model_with_ulysses_fails_before_ray(no_ray, small_assets, tiny_vlm, tmp_path, capsys):
    from trainer.datasets.synthetic import write_synthetic_dataset

    pictures, _ = write_synthetic_dataset(tmp_path / "pictures", 8, 2, tasks=("visual_colors",))
    assets = {**small_assets, "model": tiny_vlm, "train": str(pictures)}
    assert main(short_run(assets, tmp_path / "actor", f"{SP}=2")) == 2
    assert error_lines(capsys) == [
        f"error: {SP}=2 with a vision-language model (actor_rollout_ref.model.path={tiny_vlm!r} has a vision_config): "
        f"sequence parallelism does not split image inputs; set {SP}=1, or use a text-only model"
    ]
    # A critic on the vision-language model is refused by its own setting (text data: the critic check alone).
    critic = ("algorithm=ppo", "critic.ulysses_sequence_parallel_size=2", f"critic.model.path={tiny_vlm}")
    assert main(short_run(small_assets, tmp_path / "critic", *critic)) == 2
    assert error_lines(capsys) == [
        f"error: critic.ulysses_sequence_parallel_size=2 with a vision-language model (critic.model.path={tiny_vlm!r} "
        "has a vision_config): sequence parallelism does not split image inputs; set "
        "critic.ulysses_sequence_parallel_size=1, or use a text-only model"
    ]
    assert batch_split_problems(load_config(short_run(assets, tmp_path / "actor"))) == []  # size 1 trains


def test_head_checks_read_a_vision_language_models_heads_from_its_text_config(small_assets, tiny_vlm, tmp_path):
    tp = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=4")
    problem = rollout_tp_problem(load_config(short_run({**small_assets, "model": tiny_vlm}, tmp_path, *tp)))
    assert problem is not None and problem.startswith(
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4 cannot split the model's 2 attention heads (1 key/value heads)")
