"""Validation of the worker configs (plain nested dicts, verl's key names): their keys are in
workers/config_spec.py, their defaults in workers/defaults/<section>.yaml (the only place a default lives; the
trainer's config composes the same files).

Each `*_config(user)` function returns a new, complete dict: every key the worker reads is present, user
values replace the yaml's defaults, unknown keys and bad values raise ValueError naming the dotted key and what
is allowed, then the rules across keys run. The trainer passes `OmegaConf.to_container(cfg.actor_rollout_ref)`;
DictConfigs are accepted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.config_schema import validated
from workers.config_spec import ACTOR_ROLLOUT_REF_SPEC, WORKER_SECTIONS
from workers.config_spec_megatron import megatron_layout_spec
from workers.default_values import REQUIRED, section_defaults
from workers.lora.spec import check_base_sharing, check_lora_settings
from workers.routing_replay.settings import check_routing_replay

__all__ = [
    "WORKER_SECTIONS", "actor_rollout_ref_config", "complete_section", "critic_config",
    "fill_config", "mini_batch_per_rank", "multi_turn_config", "reward_model_config",
]


def _as_plain_mapping(config: Any, where: str) -> Mapping[str, Any]:
    if config is None:
        return {}
    if type(config).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)
    if not isinstance(config, Mapping):
        raise ValueError(f"config section {where or '<root>'} must be a dict, got {type(config).__name__}")
    return config


def fill_config(spec: Mapping[str, Any], user: Any, defaults: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """`user` over `defaults` (the section's yaml, resolved), checked and normalised by the spec's pydantic model
    (workers/config_schema.py): one ValueError naming every wrong key."""
    user = _as_plain_mapping(user, where)
    return validated(spec, _overlay(spec, defaults, user), where)


def _without_required(value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    return {key: _without_required(item) for key, item in value.items() if item != REQUIRED}


def _overlay(spec: Mapping[str, Any], defaults: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    """The user's keys over the defaults, section by section; a required key left unset (`???`) is absent, so
    the model reports it missing."""
    values = {key: _without_required(value) for key, value in defaults.items() if value != REQUIRED}
    for key, value in user.items():
        entry = spec.get(key)
        if isinstance(entry, Mapping) and isinstance(value, Mapping):
            values[key] = _overlay(entry, defaults.get(key, {}), value)
        else:
            values[key] = value
    return values


def multi_turn_config(user: Any) -> dict[str, Any]:
    """`rollout.multi_turn` alone (the agent loop's tests and benchmarks build it without a worker)."""
    defaults = section_defaults("actor_rollout_ref")["rollout"]["multi_turn"]
    return fill_config(ACTOR_ROLLOUT_REF_SPEC["rollout"]["multi_turn"], user, defaults, "rollout.multi_turn")


def complete_section(section: str, user: Any, where: str = "") -> dict[str, Any]:
    """`user` over workers/defaults/<section>.yaml, checked against the section's spec. A default that follows
    another key (`${..actor.use_dynamic_bsz}`) follows the user's value of that key."""
    user = _as_plain_mapping(user, where)
    return fill_config(WORKER_SECTIONS[section], user, section_defaults(section, user), where)


def actor_rollout_ref_config(user: Any, where: str = "") -> dict[str, Any]:
    """Complete, validated config of `ActorRolloutRefWorker` (sections model, actor, rollout, ref); `where`
    prefixes the keys named in errors (the trainer's `actor_rollout_ref`)."""
    config = complete_section("actor_rollout_ref", user, where)
    rollout = config["rollout"]
    if rollout["name"] == "hf" and rollout["placement"] != "hybrid":
        raise ValueError(
            "rollout.placement='separate' needs rollout.name='vllm' (HF generate runs on the actor's own model)"
        )
    tp = rollout["tensor_model_parallel_size"]
    if tp > 1 and rollout["name"] != "vllm":
        raise ValueError(
            f"rollout.tensor_model_parallel_size={tp} needs rollout.name='vllm' "
            "(HF generate runs on each actor rank's model)"
        )
    if tp > 1 and rollout["placement"] == "hybrid" and rollout["multi_turn"]["enable"]:
        raise ValueError(
            f"rollout.tensor_model_parallel_size={tp} with rollout.placement='hybrid' (one engine shared by {tp} actor "
            "ranks) runs single-turn rollouts; for rollout.multi_turn.enable=true use tensor_model_parallel_size=1 or "
            "placement='separate'"
        )
    if rollout["ignore_eos"] and rollout["multi_turn"]["enable"]:
        raise ValueError(
            "rollout.ignore_eos=true cannot be combined with rollout.multi_turn.enable=true (a model turn ends at its "
            "EOS, where the tool call is read); set one of them to false"
        )
    check_lora_settings(config, where)
    check_base_sharing(config, where)
    check_routing_replay(config, where)
    _check_lora_reference_groups(config, where)
    _fill_ref_megatron(config, where)
    _fill_ref_sequence_parallel(config, where)
    _check_sequence_parallel(config, config["actor"], _dotted(where, "actor"), where)
    _check_router_training(config["actor"], config["actor"]["strategy"], _dotted(where, "actor"))
    if config["actor"]["strategy"] == "megatron":
        _reject_fsdp_settings_on_megatron(
            {"actor.fsdp_config": config["actor"]["fsdp_config"], "ref.fsdp_config": config["ref"]["fsdp_config"]},
            where, "actor.strategy",
        )
        _reject_packing_on_megatron(config)
        _reject_hf_patches_on_megatron(config, where)
    return config


MEGATRON_LAYOUT_KEYS = frozenset(megatron_layout_spec())


def _fill_ref_megatron(config: dict[str, Any], where: str) -> None:
    """The reference's Megatron layout is the actor's: unset keys take the actor's value, set ones must equal it."""
    actor, ref = config["actor"]["megatron"], config["ref"]["megatron"]
    for key, value in ref.items():
        if key not in MEGATRON_LAYOUT_KEYS:
            continue  # its own offload switch
        if value is not None and value != actor[key]:
            raise ValueError(
                f"{_dotted(where, f'ref.megatron.{key}')}={value!r} must equal "
                f"{_dotted(where, f'actor.megatron.{key}')}={actor[key]!r}: "
                "the reference runs in the actor's processes with the actor's layout"
            )
        ref[key] = actor[key]


def _reject_fsdp_settings_on_megatron(sections: dict[str, dict[str, Any]], where: str, strategy_key: str) -> None:
    """`fsdp_config`'s offload switches and `fsdp_size` act on the FSDP workers; the Megatron workers' offload
    switches are verl's `megatron.*_offload` keys, and their data-parallel groups follow from the tensor/pipeline
    sizes."""
    megatron_section = {name: name.replace("model.", "").replace("fsdp_config", "megatron") for name in sections}
    offload = {
        _dotted(where, f"{name}.{key}=true"): _dotted(where, f"{megatron_section[name]}.{key}")
        for name, section in sections.items()
        for key, on in section.items()
        if key.endswith("_offload") and on
    }
    fsdp_only = f"{_dotted(where, strategy_key)}='fsdp' only"
    if offload:
        raise ValueError(
            f"{', '.join(offload)}: fsdp_config's offload applies to {fsdp_only}; with megatron set "
            f"{', '.join(offload.values())}=true instead (verl's keys) and this to false"
        )
    grouped = [
        _dotted(where, f"{name}.fsdp_size={section['fsdp_size']}")
        for name, section in sections.items()
        if section["fsdp_size"] != -1
    ]
    if grouped:
        raise ValueError(
            f"{', '.join(grouped)}: FSDP's shard groups apply to {fsdp_only} (Megatron's data-parallel groups follow "
            "from its tensor and pipeline sizes); set it to -1 or use strategy='fsdp'"
        )


def _check_lora_reference_groups(config: dict[str, Any], where: str) -> None:
    """A LoRA actor's reference is its own base model (adapters off): it has the actor's shard groups."""
    actor, ref = config["actor"]["fsdp_config"]["fsdp_size"], config["ref"]["fsdp_config"]["fsdp_size"]
    if config["model"]["lora_rank"] > 0 and ref not in (-1, actor):
        raise ValueError(
            f"{_dotted(where, 'ref.fsdp_config.fsdp_size')}={ref} differs from "
            f"{_dotted(where, 'actor.fsdp_config.fsdp_size')}={actor}: with LoRA the reference is the actor's own base "
            "model, sharded as the actor; set the reference's to -1 or to the actor's"
        )


def _check_router_training(section: dict[str, Any], strategy: str, prefix: str) -> None:
    """A mixture of experts' router settings (workers/megatron/router_training.py): verl's
    `megatron.override_transformer_config` keys act on megatron-core's routers; `router_aux_loss_coef` (the actor's)
    on either backend, so not beside megatron-core's own coefficient."""
    overrides = {k: v for k, v in section["megatron"]["override_transformer_config"].items() if v is not None}
    named = [_dotted(prefix, f"megatron.override_transformer_config.{key}={value}") for key, value in overrides.items()]
    if overrides and strategy != "megatron":
        raise ValueError(
            f"{', '.join(named)}: megatron-core's router settings apply to strategy='megatron' only; with fsdp the "
            f"load-balancing loss is {_dotted(prefix, 'router_aux_loss_coef')} (averaged over the layers)"
        )
    coef = section.get("router_aux_loss_coef")
    if coef is not None and overrides.get("moe_aux_loss_coeff") is not None:
        verl_key = named[list(overrides).index("moe_aux_loss_coeff")]
        raise ValueError(
            f"{_dotted(prefix, 'router_aux_loss_coef')}={coef} and {verl_key} "
            "both set the load-balancing loss (averaged over the layers, or per layer as megatron-core adds it); set "
            "one of them"
        )
    if overrides.get("moe_router_load_balancing_type") == "none" and (coef or overrides.get("moe_aux_loss_coeff")):
        raise ValueError(
            f"{_dotted(prefix, 'megatron.override_transformer_config.moe_router_load_balancing_type')}=none turns the "
            "load-balancing loss off, but a coefficient for it is set; leave the type null (or aux_loss), or unset the "
            "coefficient"
        )


def _reject_packing_on_megatron(config: dict[str, Any]) -> None:
    """Packed (THD) forwards exist for the FSDP workers only (Megatron's need Transformer Engine's attention)."""
    if config["model"]["use_remove_padding"] is True:
        raise ValueError(
            "model.use_remove_padding = true is not supported with megatron (strategy='megatron' runs padded "
            "micro-batches; a token budget, use_dynamic_bsz, fills them with as many padded rows as fit); leave "
            "model.use_remove_padding null/false, or use strategy='fsdp'"
        )


def _reject_hf_patches_on_megatron(config: dict[str, Any], where: str) -> None:
    """Liger patches Hugging Face modules (workers/liger_kernels.py), the router loss hooks them
    (workers/moe_router_loss.py), the kept layers are chosen among them (workers/checkpointed_layers.py);
    Megatron-core builds its own layers."""
    if config["model"]["use_liger"]:
        raise ValueError(
            f"{_dotted(where, 'model.use_liger')}=true applies to strategy='fsdp' only (Liger patches the Hugging Face "
            "model's modules; Megatron-core builds its own layers); set it to false or use strategy='fsdp'"
        )
    if config["model"].get("gradient_checkpointing_layers") is not None:
        raise ValueError(
            f"{_dotted(where, 'model.gradient_checkpointing_layers')} applies to strategy='fsdp' only (with "
            "strategy='megatron', model.enable_gradient_checkpointing=true recomputes every layer); leave it null or "
            "use strategy='fsdp'"
        )


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _fill_ref_sequence_parallel(config: dict[str, Any], where: str) -> None:
    """The reference runs in the actor's worker group, on the actor's (dp, sp) layout."""
    actor_size = config["actor"]["ulysses_sequence_parallel_size"]
    ref_size = config["ref"]["ulysses_sequence_parallel_size"]
    if ref_size is not None and ref_size != actor_size:
        raise ValueError(
            f"{_dotted(where, 'ref.ulysses_sequence_parallel_size')}={ref_size} differs from "
            f"{_dotted(where, 'actor.ulysses_sequence_parallel_size')}={actor_size}: the reference runs in the actor's "
            "worker group, on its sequence-parallel layout; leave it null or set the same size"
        )
    config["ref"]["ulysses_sequence_parallel_size"] = actor_size


def _check_sequence_parallel(config: dict[str, Any], section: dict[str, Any], prefix: str, where: str) -> None:
    """Ulysses splits packed sequences of the FSDP workers (the model's heads and the worker count are
    checked where they are known: the driver's batch checks and the worker's start)."""
    size = section["ulysses_sequence_parallel_size"]
    if size == 1:
        return
    key = f"{_dotted(prefix, 'ulysses_sequence_parallel_size')}={size}"
    if section["strategy"] != "fsdp":
        raise ValueError(f"{key} needs strategy='fsdp' (with megatron, use its tensor/sequence parallelism instead)")
    if config["model"]["use_remove_padding"] is False:
        raise ValueError(
            f"{key} splits packed (padding-free) sequences, but {_dotted(where, 'model.use_remove_padding')}=false "
            "runs padded forwards; set use_remove_padding to null or true, or the sequence-parallel size to 1"
        )


def critic_config(user: Any, where: str = "") -> dict[str, Any]:
    """Complete, validated config of `CriticWorker`."""
    config = complete_section("critic", user, where)
    _check_sequence_parallel(config, config, where, where)
    _check_router_training(config, config["strategy"], where)
    if config["strategy"] == "megatron":
        _reject_fsdp_settings_on_megatron({"model.fsdp_config": config["model"]["fsdp_config"]}, where, "strategy")
        _reject_packing_on_megatron(config)
        _reject_hf_patches_on_megatron(config, where)
    return config


def reward_model_config(user: Any, where: str = "") -> dict[str, Any]:
    """Complete, validated config of `RewardModelWorker`."""
    return complete_section("reward_model", user, where)


def mini_batch_per_rank(section: Mapping[str, Any], responses_per_prompt: int, world_size: int, where: str) -> int:
    """Rows of one optimizer step on each data-parallel rank (or group of sequence-parallel ranks).
    `ppo_mini_batch_size` counts prompts, global (verl's unit): a mini-batch is that many prompts x their
    `responses_per_prompt` responses (the actor's rollout.n, the critic's rollout_n), shared evenly."""
    prompts = section["ppo_mini_batch_size"]
    rows = prompts * responses_per_prompt
    if rows % world_size:
        raise ValueError(
            f"{where}.ppo_mini_batch_size={prompts} prompts x {responses_per_prompt} responses = {rows} rows per "
            f"optimizer step must be divisible by the number of workers ({world_size}): each takes an equal share"
        )
    return rows // world_size
