"""verl launch-script habits at the config level: all bad keys in one message, did-you-mean, verl keys with no
meaning here refused with why, speed hints accepted with one note, --config-path / --config-name, the estimator's
defaults for `algorithm.adv_estimator=...` alone, and `ref.megatron.*`."""

import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from trainer.algorithm_names import ESTIMATOR_GROUPS
from trainer.config_loader import ConfigError, load_config
from trainer.main import main
from trainer.role_groups import actor_worker_config
from trainer.verl_keys import VERL_KEYS, find_verl_key
from workers.config import actor_rollout_ref_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "trainer" / "config"


def test_every_bad_key_of_a_command_is_named_in_one_message():
    with pytest.raises(ConfigError) as error:
        load_config([
            "actor_rollout_ref.actor.optim.lrr=1",
            "trainer.max_ckpt_to_kep=2",
            "data.train_batch_size=8",  # a good key among them stays out of the message
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.hybrid_engine=false",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        ])
    lines = str(error.value).splitlines()
    assert lines[0] == "5 settings of this command are not valid here:"
    assert lines[1:] == [
        "  unknown config key 'actor_rollout_ref.actor.optim.lrr'; did you mean 'actor_rollout_ref.actor.optim.lr'?",
        "  unknown config key 'trainer.max_ckpt_to_kep'; did you mean 'trainer.max_ckpt_to_keep'?",
        "  actor_rollout_ref.rollout.name=sglang: " + find_reason("actor_rollout_ref.rollout.name", "sglang"),
        "  actor_rollout_ref.hybrid_engine=false: the actor and its engine share processes here with "
        "rollout.placement=hybrid (the default); only ['true'] is accepted here; use actor_rollout_ref.rollout.placement",
        "  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3: model turns per conversation; use "
        "actor_rollout_ref.rollout.multi_turn.max_turns",
    ]


def find_reason(key, value):
    from trainer.verl_keys import VERL_VALUES

    return VERL_VALUES[(key, value)]


def test_a_key_without_a_close_name_lists_the_keys_at_its_level():
    with pytest.raises(ConfigError, match=r"^unknown config key 'trainer.zzz'; valid keys under trainer: \['balance_batch'"):
        load_config(["trainer.zzz=1"])


def test_speed_hints_are_accepted_and_reported_once(capsys):
    cfg = load_config([
        "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.rollout.layered_summon=True",
        "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=0",
        "trainer.use_legacy_worker_impl=auto",
        "data.train_batch_size=8",
    ])
    assert cfg.data.train_batch_size == 8 and "use_fused_kernels" not in cfg.actor_rollout_ref.model
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 4
    assert notes[0].startswith("note: actor_rollout_ref.model.use_fused_kernels=True has no effect here: log-probs")


def test_the_table_names_only_keys_that_exist_here():
    cfg = load_config([])
    for entry in VERL_KEYS:
        assert find_verl_key(entry.pattern.replace("*", "x")) is not None
        if entry.nearest.split(".")[0] in cfg:  # a full dotted key (others are relative: `optim.lr_scheduler_type`)
            assert OmegaConf.select(cfg, entry.nearest, default="absent") != "absent", entry.nearest
        assert OmegaConf.select(cfg, entry.pattern, default="absent") == "absent", f"{entry.pattern} exists here now"


def test_the_estimator_alone_brings_its_groups_defaults():
    ppo = load_config(["algorithm.adv_estimator=gae"])
    assert (ppo.actor_rollout_ref.rollout.n, ppo.actor_rollout_ref.actor.use_kl_loss) == (1, False)
    chosen = load_config(["algorithm=grpo", "algorithm.adv_estimator=rloo"])  # a named group wins
    assert (chosen.algorithm.adv_estimator, chosen.actor_rollout_ref.rollout.n) == ("rloo", 8)
    for estimator, group in ESTIMATOR_GROUPS.items():
        group_file = OmegaConf.load(CONFIG_DIR / "algorithm" / f"{group}.yaml")
        assert group_file.algorithm.adv_estimator == estimator or estimator.startswith(group_file.algorithm.adv_estimator)
        assert load_config([f"algorithm.adv_estimator={estimator}"]).algorithm.adv_estimator == estimator


def test_the_estimator_names_are_the_registrys():
    from trainer.algorithms import ADVANTAGE_ESTIMATORS

    assert set(ESTIMATOR_GROUPS) == set(ADVANTAGE_ESTIMATORS)


def test_verls_config_names_are_built_in():
    megatron = load_config(["--config-path=config", "--config-name='ppo_megatron_trainer.yaml'"])
    assert (megatron.actor_rollout_ref.actor.strategy, megatron.critic.strategy) == ("megatron", "megatron")
    assert load_config(["--config-name", "ppo_trainer"]).actor_rollout_ref.actor.strategy == "fsdp"
    with pytest.raises(ConfigError, match=r"--config-name=nope: no built-in config has that name; built-in: "):
        load_config(["--config-name=nope"])


def write_user_config(folder, body):
    folder.mkdir(exist_ok=True)
    (folder / "my_grpo.yaml").write_text(textwrap.dedent(body))
    return folder


def test_a_users_yaml_composes_over_the_trainers(tmp_path, capsys):
    folder = write_user_config(tmp_path / "config", """\
        hydra:
          searchpath:
            - file://verl/trainer/config
        defaults:
          - ppo_trainer
          - _self_
        data:
          max_prompt_length: 48
          train_batch_size: 32
        actor_rollout_ref:
          hybrid_engine: True
          rollout:
            n: 4
        """)
    cfg = load_config([f"--config-path={folder}", "--config-name=my_grpo", "data.train_batch_size=16"])
    assert (cfg.data.max_prompt_length, cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (48, 16, 4)
    assert "note: actor_rollout_ref.hybrid_engine=true (in my_grpo.yaml) has no effect here" in capsys.readouterr().err


def test_a_users_yaml_with_bad_keys_names_them_all(tmp_path, capsys):
    folder = write_user_config(tmp_path / "config", """\
        defaults:
          - ppo_trainer
          - _self_
        data:
          max_prompt_lenght: 48
        actor_rollout_ref:
          hybrid_engine: false
        """)
    assert main(["--config-path", str(folder), "--config-name", "my_grpo", "trainer.zzz=1", "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 3 settings of this command are not valid here:")
    assert "unknown config key 'data.max_prompt_lenght' (in my_grpo.yaml); did you mean 'data.max_prompt_length'?" in err
    assert "actor_rollout_ref.hybrid_engine=false (in my_grpo.yaml): the actor and its engine share processes" in err
    assert "unknown config key 'trainer.zzz'" in err


def test_fsdp_size_is_every_rank_or_a_divisor_of_the_ranks():
    def worker_config(*overrides):
        return actor_rollout_ref_config(actor_worker_config(load_config(["trainer.n_gpus_per_node=8", *overrides])),
                                        "actor_rollout_ref")

    assert worker_config("actor_rollout_ref.actor.fsdp_config.fsdp_size=32")  # >= the ranks: over all of them
    assert worker_config("actor_rollout_ref.actor.fsdp_config.fsdp_size=4")["actor"]["fsdp_config"]["fsdp_size"] == 4
    with pytest.raises(ConfigError, match=r"critic.model.fsdp_config.fsdp_size=3 does not divide the 8 workers .* "
                                          r"use a divisor of the workers, or -1"):
        load_config(["critic.model.fsdp_config.fsdp_size=3", "trainer.n_gpus_per_node=8"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.ref.fsdp_config.fsdp_size' must be -1 .* got 0"):
        load_config(["actor_rollout_ref.ref.fsdp_config.fsdp_size=0"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.fsdp_config.fsdp_size=4: FSDP's shard groups apply "
                                         r"to actor_rollout_ref.actor.strategy='fsdp' only"):
        worker_config("actor_rollout_ref.actor.fsdp_config.fsdp_size=4", "actor_rollout_ref.actor.strategy=megatron")
    with pytest.raises(ValueError, match=r"ref.fsdp_config.fsdp_size=2 differs from .*actor.fsdp_config.fsdp_size=4: "
                                         r"with LoRA the reference is the actor's own base"):
        worker_config("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.fsdp_config.fsdp_size=4",
                      "actor_rollout_ref.ref.fsdp_config.fsdp_size=2")


def test_the_reference_megatron_layout_must_be_the_actors():
    def worker_config(*overrides):
        return actor_rollout_ref_config(actor_worker_config(load_config(list(overrides))), "actor_rollout_ref")

    assert worker_config("actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1")["ref"]["megatron"]["tensor_model_parallel_size"] == 1
    with pytest.raises(ValueError, match=r"ref.megatron.tensor_model_parallel_size=2 must equal actor_rollout_ref.actor.megatron"):
        worker_config("actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2")


def test_verls_megatron_transformer_config_keys():
    # verl's Megatron MoE scripts (examples/router_replay, the Qwen3-MoE scripts) set recompute, the routers and the
    # kernels through the transformer config overrides: here full recompute of every layer is the model's checkpointing
    # switch, the routers' keys are taken, the kernel switches are hints, and other megatron-core fields are refused.
    with pytest.raises(ConfigError) as error:
        load_config([
            "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=selective",
            "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32",
            "+actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=4",
            "+actor_rollout_ref.ref.megatron.override_transformer_config.moe_router_dtype=fp32",
        ])
    lines = str(error.value).splitlines()[1:]
    assert len(lines) == 3
    assert lines[0].startswith("  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity="
                               "selective:")
    assert lines[0].endswith("; use actor_rollout_ref.model.enable_gradient_checkpointing")
    assert "num_layers_in_first_pipeline_stage=4: Megatron's transformer config comes from the Hugging Face" in lines[1]
    assert lines[2].endswith("moe_router_dtype=fp32: the reference runs with the actor's transformer config; use "
                             "actor_rollout_ref.actor.megatron.override_transformer_config")
    verl_router = "+actor_rollout_ref.actor.megatron.override_transformer_config"
    cfg = load_config([
        "actor_rollout_ref.actor.strategy=megatron", f"{verl_router}.moe_router_dtype=fp32",
        f"{verl_router}.moe_aux_loss_coeff=0.01", f"{verl_router}.moe_grouped_gemm=True",
        f"{verl_router}.moe_token_dispatcher_type=flex",
    ])
    assert not cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    taken = actor_rollout_ref_config(actor_worker_config(cfg), "actor_rollout_ref")["actor"]["megatron"]
    assert taken["override_transformer_config"] == {
        "moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": None, "moe_router_load_balancing_type": None,
        "moe_router_dtype": "fp32",
    }


def test_verls_expert_tp_size_is_taken():
    """verl's scripts set the experts' TP size apart from the TP size ("parallel folding", e.g. TP 2 with expert TP
    1): the key reaches the actor's and the reference's Megatron layout (sizes are checked against the model and the
    worker count by the driver's batch checks and at the workers' start)."""
    def worker_config(*overrides):
        return actor_rollout_ref_config(actor_worker_config(load_config(list(overrides))), "actor_rollout_ref")

    megatron = "actor_rollout_ref.actor.strategy=megatron"
    taken = worker_config(megatron, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                          "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
                          "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1")
    assert taken["actor"]["megatron"]["expert_tensor_parallel_size"] == 1
    assert taken["ref"]["megatron"]["expert_tensor_parallel_size"] == 1  # the reference takes the actor's layout
    assert worker_config(megatron)["actor"]["megatron"]["expert_tensor_parallel_size"] is None


def test_verls_full_recompute_is_the_checkpointing_switch(capsys):
    """verl's `recompute_granularity=full` (with `recompute_method=uniform`, `recompute_num_layers=1`: each layer
    recomputed on its own) is what model.enable_gradient_checkpointing=true does to Megatron's layers here."""
    keys = "+{}.megatron.override_transformer_config.recompute_{}"
    cfg = load_config([
        "actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron", "algorithm.adv_estimator=gae",
        keys.format("actor_rollout_ref.actor", "granularity=full"), keys.format("actor_rollout_ref.actor", "method=uniform"),
        keys.format("actor_rollout_ref.actor", "num_layers=1"), keys.format("critic", "granularity=full"),
    ])
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing and cfg.critic.model.enable_gradient_checkpointing
    assert "recompute_granularity=full is actor_rollout_ref.model.enable_gradient_checkpointing=true here" in (
        capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match=r"recompute_num_layers=4: Megatron's layers are recomputed here \(all of "
                       r"them, one at a time"):
        load_config([keys.format("actor_rollout_ref.actor", "granularity=full"),
                     keys.format("actor_rollout_ref.actor", "num_layers=4")])
