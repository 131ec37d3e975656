"""Config defaults and validation (no Ray)."""

from __future__ import annotations

import pytest

from workers.config import actor_rollout_ref_config, critic_config, mini_batch_per_rank, reward_model_config


def test_defaults_are_filled_and_values_normalised():
    config = actor_rollout_ref_config({"model": {"path": "/m"}, "actor": {"optim": {"lr": 1}}})
    assert config["model"] == {"path": "/m", "dtype": "auto", "enable_gradient_checkpointing": False,
                               "gradient_checkpointing_layers": None, "attn_implementation": None, "use_liger": False, "use_remove_padding": None, "lora_rank": 0, "lora_alpha": 16,
                               "target_modules": "all-linear", "exclude_modules": None, "logits_chunk_tokens": 2048,
                               "override_config": {}}
    assert "lora_rank" not in critic_config({"model": {"path": "/m"}})["model"]  # LoRA is the actor's
    assert "logits_chunk_tokens" not in critic_config({"model": {"path": "/m"}})["model"]  # a value head: no logits
    assert config["actor"]["optim"]["lr"] == 1.0 and isinstance(config["actor"]["optim"]["lr"], float)
    assert config["actor"]["ppo_epochs"] == 1 and config["actor"]["loss_agg_mode"] == "token-mean"
    assert config["rollout"]["response_length"] == 512 and config["rollout"]["do_sample"] is True
    assert config["rollout"]["ignore_eos"] is False
    assert config["seed"] == 0 and config["rollout"]["name"] == "hf" and config["rollout"]["n"] == 1
    assert config["ref"]["log_prob_micro_batch_size_per_gpu"] == 64
    assert critic_config({"model": {"path": "/m"}})["cliprange_value"] == 0.5
    assert reward_model_config({"model": {"path": "/m"}})["micro_batch_size_per_gpu"] == 32


def test_user_dict_is_not_modified_and_omegaconf_is_accepted():
    from omegaconf import OmegaConf

    user = {"model": {"path": "/m"}}
    actor_rollout_ref_config(user)
    assert user == {"model": {"path": "/m"}}
    config = actor_rollout_ref_config(OmegaConf.create({"model": {"path": "/m"}, "rollout": {"eos_token_id": [1, 2]}}))
    assert config["rollout"]["eos_token_id"] == [1, 2]


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['lrr'\] in section 'actor.optim'.*'lr'"):
        actor_rollout_ref_config({"model": {"path": "/m"}, "actor": {"optim": {"lrr": 1e-3}}})
    with pytest.raises(ValueError, match=r"\['critic'\] at the top level; valid keys: \['actor', 'model', 'ref', 'release_cached_blocks', 'rollout', 'seed'\]"):
        actor_rollout_ref_config({"model": {"path": "/m"}, "critic": {}})


# The key, what was wrong (the value) and what is valid.
KV_CACHE_GIB = r"rollout.kv_cache_gib' must be None \(vLLM sizes its KV cache within gpu_memory_utilization\) or a number > 0 .*, got "


@pytest.mark.parametrize(
    "override, message",
    [
        ({"actor": {"ppo_micro_batch_size_per_gpu": 0}}, r"actor.ppo_micro_batch_size_per_gpu' must be an int >= 1, got 0"),
        ({"actor": {"ppo_epochs": True}}, r"actor.ppo_epochs' must be an int >= 1, got True"),
        ({"actor": {"loss_agg_mode": "mean"}}, r"actor.loss_agg_mode' must be one of \['token-mean'"),
        ({"actor": {"kl_loss_type": "kl2"}}, r"actor.kl_loss_type' must be one of"),
        ({"actor": {"clip_ratio_c": 1.0}}, r"actor.clip_ratio_c' must be a float > 1"),
        ({"actor": {"optim": {"lr_scheduler_type": "linear"}}}, r"lr_scheduler_type' must be one of \['constant', 'cosine'\]"),
        ({"rollout": {"temperature": 0}}, r"rollout.temperature' must be a float > 0"),
        ({"rollout": {"eos_token_id": "eos"}}, r"rollout.eos_token_id' must be None"),
        ({"model": {"dtype": "fp16"}}, r"model.dtype' must be one of \['auto', 'float32', 'bfloat16', 'float16'\]"),
        ({"actor": []}, r"section actor must be a dict, got list"),
        ({"rollout": {"name": "sglang"}}, r"rollout.name' must be one of \['hf', 'vllm'\]"),
        ({"rollout": {"placement": "remote"}}, r"rollout.placement' must be one of \['hybrid', 'separate'\]"),
        ({"rollout": {"gpu_memory_utilization": 1.5}}, r"rollout.gpu_memory_utilization' must be a float in \(0, 1\]"),
        ({"rollout": {"kv_cache_gib": 0}}, KV_CACHE_GIB + "0$"),
        ({"rollout": {"kv_cache_gib": -2.0}}, KV_CACHE_GIB + "-2.0$"),
        ({"rollout": {"kv_cache_gib": "2"}}, KV_CACHE_GIB + "'2'$"),
        ({"rollout": {"kv_cache_gib": True}}, KV_CACHE_GIB + "True$"),
        ({"rollout": {"name": "vllm", "verify_tolerance": 0}}, r"rollout.verify_tolerance' must be None"),
        ({"rollout": {"placement": "separate"}}, r"placement='separate' needs rollout.name='vllm'"),
        ({"rollout": {"tensor_model_parallel_size": 2}}, r"tensor_model_parallel_size=2 needs rollout.name='vllm' \(HF generate"),
        ({"rollout": {"name": "vllm", "tensor_model_parallel_size": 2, "multi_turn": {"enable": True}}},
         r"tensor_model_parallel_size=2 with rollout.placement='hybrid' \(one engine shared by 2 actor ranks\) runs single-turn"),
        ({"model": {"path": "/m", "override_config": {"": 1}}}, r"model.override_config' must be a mapping of config.json"),
        ({"actor": {"fsdp_config": {"param_offload": "yes"}}}, r"actor.fsdp_config.param_offload' must be a bool"),
        ({"rollout": {"ignore_eos": "yes"}}, r"rollout.ignore_eos' must be a bool"),
        ({"rollout": {"ignore_eos": True, "multi_turn": {"enable": True}}}, r"ignore_eos=true cannot be combined with rollout.multi_turn.enable"),
        ({"model": {"lora_rank": -1}}, r"model.lora_rank' must be an int >= 0"),
        ({"model": {"lora_alpha": 0}}, r"model.lora_alpha' must be a float > 0"),
        ({"model": {"target_modules": []}}, r"model.target_modules' must be 'all-linear' or a list of module names"),
        ({"model": {"exclude_modules": [""]}}, r"model.exclude_modules' must be None or a module name"),
        ({"model": {"lora_rank": 8}, "actor": {"strategy": "megatron"}}, r"model.lora_rank=8 needs actor.strategy=fsdp"),
        ({"model": {"lora_rank": 1024}, "rollout": {"name": "vllm"}}, r"model.lora_rank=1024 is above vLLM's largest adapter rank 512"),
    ],
)
def test_bad_values_name_key_and_expectation(override, message):
    config = {"model": {"path": "/m"}}
    for section, values in override.items():
        config[section] = {**config.get(section, {}), **values} if isinstance(values, dict) else values
    with pytest.raises(ValueError, match=message):
        actor_rollout_ref_config(config)


def test_a_fixed_kv_cache_size_is_null_or_a_positive_number_of_gib():
    def kv(value):
        return actor_rollout_ref_config({"model": {"path": "/m"}, "rollout": {"kv_cache_gib": value}})["rollout"]["kv_cache_gib"]

    assert actor_rollout_ref_config({"model": {"path": "/m"}})["rollout"]["kv_cache_gib"] is None  # vLLM measures
    assert kv(None) is None and kv(2.0) == 2.0
    assert kv(2) == 2.0 and isinstance(kv(2), float)


def test_the_engine_fixes_its_kv_cache_on_a_gpu_only_when_kv_cache_gib_is_set():
    """`device_options` builds the device's `LLM(...)` arguments without starting vLLM: on a GPU a set
    rollout.kv_cache_gib adds kv_cache_memory_bytes and keeps gpu_memory_utilization (vLLM still requires that
    fraction free at its start); CPU sizes its cache from cpu_kv_cache_mb either way."""
    import torch

    from workers.rollout.vllm_options import device_options

    rollout = actor_rollout_ref_config({"model": {"path": "/m"}, "rollout": {"name": "vllm", "cuda_graph_max_batch": 16}})["rollout"]
    cuda = torch.device("cuda")
    measured = device_options(rollout, cuda, sleep=True)
    assert measured == {"gpu_memory_utilization": 0.5, "enable_sleep_mode": True,
                        "compilation_config": {"max_cudagraph_capture_size": 16}}
    fixed = device_options({**rollout, "kv_cache_gib": 2.5}, cuda, sleep=True)
    assert fixed == {**measured, "kv_cache_memory_bytes": int(2.5 * 2**30)}
    assert device_options({**rollout, "kv_cache_gib": 3}, cuda, sleep=False)["kv_cache_memory_bytes"] == 3 << 30
    cpu = {"kv_cache_memory_bytes": 256 << 20, "enable_chunked_prefill": False}
    assert device_options(rollout, torch.device("cpu"), sleep=False) == cpu
    assert device_options({**rollout, "kv_cache_gib": 2.5}, torch.device("cpu"), sleep=False) == cpu


def test_missing_path_and_indivisible_mini_batch():
    with pytest.raises(ValueError, match=r"'model.path' is required"):
        actor_rollout_ref_config({})
    assert mini_batch_per_rank({"ppo_mini_batch_size": 8}, 1, 2, "actor") == 4
    assert mini_batch_per_rank({"ppo_mini_batch_size": 2}, 8, 4, "actor") == 4  # prompts x responses, shared
    message = r"actor.ppo_mini_batch_size=3 prompts x 2 responses = 6 rows .* divisible by the number of workers \(4\)"
    with pytest.raises(ValueError, match=message):
        mini_batch_per_rank({"ppo_mini_batch_size": 3}, 2, 4, "actor")


def test_worker_rejects_unknown_role_and_bad_config_at_construction():
    from workers.fsdp import ActorRolloutRefWorker

    with pytest.raises(ValueError, match=r"unknown role 'critic'; valid roles: \['actor_rollout', 'actor_rollout_ref', 'ref'\]"):
        ActorRolloutRefWorker({"model": {"path": "/m"}}, "critic")
    with pytest.raises(ValueError, match="unknown config key"):
        ActorRolloutRefWorker({"model": {"path": "/m", "tokenizer": "x"}}, "ref")


def test_packing_is_refused_with_megatron_and_token_budgets_are_taken():
    with pytest.raises(ValueError, match="use_remove_padding = true is not supported with megatron"):
        actor_rollout_ref_config({"model": {"path": "/m", "use_remove_padding": True}, "actor": {"strategy": "megatron"}})
    with pytest.raises(ValueError, match="use_remove_padding = true is not supported with megatron"):
        critic_config({"model": {"path": "/m", "use_remove_padding": True}, "strategy": "megatron"})
    budget = {"strategy": "megatron", "use_dynamic_bsz": True}
    assert actor_rollout_ref_config({"model": {"path": "/m"}, "actor": budget})["actor"]["use_dynamic_bsz"] is True
    assert critic_config({"model": {"path": "/m"}, **budget})["use_dynamic_bsz"] is True
    assert actor_rollout_ref_config({"model": {"path": "/m"}, "actor": {"strategy": "megatron"}})["model"]["use_remove_padding"] is None


def test_the_reference_offload_follows_the_actor_and_is_fsdp_only():
    from trainer.config_loader import load_config
    from trainer.role_groups import actor_worker_config

    offloaded = actor_worker_config(load_config(["actor_rollout_ref.actor.fsdp_config.param_offload=true"]))
    assert actor_rollout_ref_config(offloaded)["ref"]["fsdp_config"]["param_offload"] is True
    kept = actor_worker_config(load_config(["actor_rollout_ref.actor.fsdp_config.param_offload=true", "actor_rollout_ref.ref.fsdp_config.param_offload=false"]))
    assert actor_rollout_ref_config(kept)["ref"]["fsdp_config"]["param_offload"] is False
    assert actor_rollout_ref_config({"model": {"path": "/m"}})["ref"]["fsdp_config"]["param_offload"] is False
    with pytest.raises(ValueError, match=r"^ref.fsdp_config.param_offload=true: fsdp_config's offload applies to "
                       r"actor.strategy='fsdp' only; with megatron set ref.megatron.param_offload=true instead"):
        actor_rollout_ref_config({"model": {"path": "/m"}, "actor": {"strategy": "megatron"}, "ref": {"fsdp_config": {"param_offload": True}}})


def test_megatron_takes_verls_offload_switches_and_the_reference_follows_the_actor():
    from trainer.config_loader import load_config
    from trainer.role_groups import actor_worker_config, critic_worker_config

    switches = ("param_offload", "grad_offload", "optimizer_offload")
    megatron = ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron"]
    plain = actor_rollout_ref_config(actor_worker_config(load_config(megatron)))
    assert [plain["actor"]["megatron"][k] for k in switches] == [False] * 3
    assert plain["ref"]["megatron"]["param_offload"] is False
    on = [f"actor_rollout_ref.actor.megatron.{k}=true" for k in switches]
    config = actor_rollout_ref_config(actor_worker_config(load_config(megatron + on)))
    assert [config["actor"]["megatron"][k] for k in switches] == [True] * 3
    assert config["ref"]["megatron"]["param_offload"] is True  # as the actor's, unless set
    kept = load_config(megatron + on + ["actor_rollout_ref.ref.megatron.param_offload=false"])
    assert actor_rollout_ref_config(actor_worker_config(kept))["ref"]["megatron"]["param_offload"] is False
    critic = critic_config(critic_worker_config(load_config(megatron + ["critic.megatron.grad_offload=true"])))
    assert [critic["megatron"][k] for k in switches] == [False, True, False]
    with pytest.raises(ValueError, match=r"'actor.megatron.grad_offload' must be a bool .*got 'yes'"):
        actor_rollout_ref_config({"model": {"path": "/m"}, "actor": {"strategy": "megatron", "megatron": {"grad_offload": "yes"}}})


def test_the_critic_takes_verls_offload_switches_under_model_fsdp_config():
    from trainer.config_loader import load_config
    from trainer.role_groups import critic_worker_config

    assert critic_config({"model": {"path": "/m"}})["model"]["fsdp_config"] == {
        "fsdp_size": -1, "param_offload": False, "optimizer_offload": False,
    }
    both = ["critic.model.fsdp_config.param_offload=true", "critic.model.fsdp_config.optimizer_offload=true"]
    assert critic_config(critic_worker_config(load_config(both)))["model"]["fsdp_config"] == {
        "fsdp_size": -1, "param_offload": True, "optimizer_offload": True,
    }
    # the actor's switches are not the critic's
    actor_only = critic_worker_config(load_config(["actor_rollout_ref.actor.fsdp_config.param_offload=true"]))
    assert critic_config(actor_only)["model"]["fsdp_config"]["param_offload"] is False
    assert "fsdp_config" not in reward_model_config({"model": {"path": "/m"}})["model"]
    for key in ("param_offload", "optimizer_offload"):
        with pytest.raises(ValueError, match=rf"'critic.model.fsdp_config.{key}' must be a bool .*got 'yes'"):
            critic_config({"model": {"path": "/m", "fsdp_config": {key: "yes"}}}, "critic")
        with pytest.raises(ValueError, match=rf"^critic.model.fsdp_config.{key}=true: fsdp_config's offload applies to "
                           rf"critic.strategy='fsdp' only; with megatron set critic.megatron.{key}=true instead"):
            critic_config({"model": {"path": "/m", "fsdp_config": {key: True}}, "strategy": "megatron"}, "critic")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['param_ofload'\] in section 'critic.model.fsdp_config'"):
        critic_config({"model": {"path": "/m", "fsdp_config": {"param_ofload": True}}}, "critic")


def test_cuda_graphs_are_on_by_default_on_a_gpu_only_and_capture_what_one_engine_decodes():
    import torch

    from trainer.config_loader import load_config
    from trainer.role_groups import actor_worker_config
    from workers.rollout.vllm_options import eager_mode

    rollout = actor_rollout_ref_config({"model": {"path": "/m"}})["rollout"]
    assert rollout["enforce_eager"] is None and rollout["cuda_graph_max_batch"] is None
    assert eager_mode(rollout, torch.device("cpu")) is True  # vLLM's CPU build would torch.compile at start
    assert eager_mode(rollout, torch.device("cuda")) is False
    assert eager_mode({**rollout, "enforce_eager": True}, torch.device("cuda")) is True
    assert eager_mode({**rollout, "enforce_eager": False}, torch.device("cpu")) is False

    def decode_batch(*overrides: str) -> int:
        return actor_worker_config(load_config(list(overrides)))["rollout"]["cuda_graph_max_batch"]

    # Hybrid: one engine per actor rank shares the prompts x n responses; separate: num_engines do.
    assert decode_batch("data.train_batch_size=8", "actor_rollout_ref.rollout.n=8") == 8 * 8 // 2
    assert decode_batch("data.train_batch_size=8", "actor_rollout_ref.rollout.n=8", "trainer.n_gpus_per_node=1") == 64
    # A hybrid engine of tensor parallel 2 decodes the rows of both ranks sharing it.
    assert decode_batch("data.train_batch_size=8", "actor_rollout_ref.rollout.n=8", "trainer.n_gpus_per_node=4",
                        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2") == 32
    assert decode_batch("data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6", "actor_rollout_ref.rollout.n=5",
                        "trainer.n_gpus_per_node=4") == 8  # 30 / 4, rounded up
    assert decode_batch("data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.placement=separate",
                        "actor_rollout_ref.rollout.num_engines=4") == 8
    assert decode_batch("actor_rollout_ref.rollout.cuda_graph_max_batch=48") == 48
    # Async: the stream keeps (max_staleness + 1) batches of groups out, all decoding at once at the fill.
    separate = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate",
                "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    async2 = ("actor_rollout_ref.rollout.async_training=true", "actor_rollout_ref.rollout.max_staleness=2")
    assert decode_batch(*separate, *async2) == 3 * 8 * 4
    assert decode_batch(*separate, "actor_rollout_ref.rollout.async_training=true",
                        "actor_rollout_ref.rollout.max_staleness=1",
                        "actor_rollout_ref.rollout.num_engines=2") == 2 * 8 * 4 // 2
    assert decode_batch(*separate, "actor_rollout_ref.rollout.staleness=1") == 8 * 4  # one batch generates at a time


def test_megatron_recomputes_every_layer_and_refuses_a_count_of_them():
    # model.gradient_checkpointing_layers picks the Hugging Face layers that recompute; Megatron recomputes all.
    with pytest.raises(ValueError, match=r"^model.gradient_checkpointing_layers applies to strategy='fsdp' only .*"
                                         r"enable_gradient_checkpointing=true recomputes every layer"):
        actor_rollout_ref_config({"model": {"path": "/m", "enable_gradient_checkpointing": True,
                                            "gradient_checkpointing_layers": 2}, "actor": {"strategy": "megatron"}})
    with pytest.raises(ValueError, match=r"^critic.model.gradient_checkpointing_layers applies to strategy='fsdp'"):
        critic_config({"model": {"path": "/m", "gradient_checkpointing_layers": 2}, "strategy": "megatron"}, "critic")
    checkpointed = {"model": {"path": "/m", "enable_gradient_checkpointing": True}, "actor": {"strategy": "megatron"}}
    assert actor_rollout_ref_config(checkpointed)["model"]["enable_gradient_checkpointing"] is True
