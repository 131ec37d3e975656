"""DAPO, GSPO and Dr. GRPO settings: accepted as verl names them, refused with one `error:` line (exit 2)
before anything starts."""

import pytest

from trainer.config_loader import load_config
from trainer.main import main
from workers.rl_math.names import LOSS_AGG_MODES


def test_the_dapo_preset_holds_dapos_defaults():
    cfg = load_config(["algorithm=dapo"])
    assert cfg.algorithm.adv_estimator == "grpo" and not cfg.algorithm.use_kl_in_reward
    assert dict(cfg.algorithm.filter_groups) == {"enable": True, "metric": "acc", "max_num_gen_batches": 10}
    actor = cfg.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode, actor.use_kl_loss) == (0.2, 0.28, "token-mean", False)
    assert cfg.reward_model.reward_manager == "dapo"
    assert dict(cfg.reward_model.overlong_buffer) == {"enable": True, "len": 3, "penalty_factor": 1.0, "log": True}
    assert cfg.data.max_response_length == 12 == cfg.actor_rollout_ref.rollout.response_length
    assert load_config(["algorithm=dapo", "data.max_response_length=512"]).data.max_response_length == 512  # yours wins


def test_the_settings_verl_users_write_are_accepted():
    cfg = load_config([
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward",
        "algorithm.filter_groups.max_num_gen_batches=0", "data.gen_batch_size=48",
        "reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4",
        "reward_model.overlong_buffer.penalty_factor=0.5", "reward_model.overlong_buffer.log=true",
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    ])
    assert cfg.data.gen_batch_size == 48 and cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
    dr_grpo = load_config(["algorithm.norm_adv_by_std_in_grpo=false", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"])
    assert dr_grpo.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-sum-norm"


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_every_aggregation_mode_is_accepted(mode):
    assert load_config([f"actor_rollout_ref.actor.loss_agg_mode={mode}"]).actor_rollout_ref.actor.loss_agg_mode == mode


FILTER = "algorithm.filter_groups.enable=true"
DAPO, OVERLONG = "reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=true"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([FILTER, "algorithm.filter_groups.metric=accuracy"],
         "algorithm.filter_groups.metric='accuracy' is not valid; choose one of ['acc', 'score', 'seq_reward', 'seq_final_reward']"),
        ([FILTER, "algorithm.filter_groups.max_num_gen_batches=-1"], "max_num_gen_batches=-1 must be an integer >= 0"),
        ([FILTER, "actor_rollout_ref.rollout.n=1"], "set actor_rollout_ref.rollout.n >= 2 (got 1)"),
        ([FILTER, "algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=true"], "use metric=seq_reward"),
        ([FILTER, "algorithm.filter_groups.max_num_gen_batches=1", "data.gen_batch_size=8"],
         "max_num_gen_batches=1 batches of 8 prompts (data.gen_batch_size) can never fill data.train_batch_size=16"),
        (["data.gen_batch_size=32"], "only algorithm.filter_groups.enable=true uses"),
        (["data.gen_batch_size=0"], "data.gen_batch_size=0 must be null"),
        ([DAPO, OVERLONG], "reward_model.overlong_buffer.len=0 must be an integer in 1..7"),
        ([DAPO, OVERLONG, "reward_model.overlong_buffer.len=8"], "reward_model.overlong_buffer.len=8 must be an integer in 1..7"),
        ([DAPO, OVERLONG, "reward_model.overlong_buffer.len=2", "reward_model.overlong_buffer.penalty_factor=-1"],
         "penalty_factor=-1 must be a number >= 0"),
        ([OVERLONG, "reward_model.overlong_buffer.len=2"],
         "reward_model.overlong_buffer.enable=true applies with reward_model.reward_manager=dapo"),
        (["reward_model.reward_manager=prime"], "reward_model.reward_manager='prime' is not valid; choose one of ['naive', 'dapo']"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=gpg"], "'actor_rollout_ref.actor.policy_loss.loss_mode' must be one of ['vanilla', 'gspo', 'geo_mean']"),
        (["actor_rollout_ref.actor.loss_agg_mode=token-sum"], "'actor_rollout_ref.actor.loss_agg_mode' must be one of ['token-mean'"),
        ([DAPO, OVERLONG, "reward_model.overlong_buffer.len=2", "reward_model.overlong_buffer.log=1"],
         "reward_model.overlong_buffer.log=1 must be true or false"),
    ],
)
def test_bad_settings_fail_on_one_error_line_before_ray(no_ray, capsys, overrides, expected):
    assert main(overrides) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("error:") == 1 and expected in err, err


def test_filter_groups_with_one_step_off_generation_is_refused():
    from trainer.config_loader import ConfigError

    separate = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.staleness=1"]
    with pytest.raises(ConfigError, match="needs actor_rollout_ref.rollout.staleness=0"):
        load_config([FILTER, *separate])
