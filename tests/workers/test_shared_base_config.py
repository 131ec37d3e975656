"""rollout.share_base_weights: true where the base cannot be shared is refused with the reason (before Ray starts,
one `error:` line and exit code 2); null shares where possible, false never; the dtypes resolve on the worker."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.conftest import run_overrides
from trainer.main import main
from workers.config import actor_rollout_ref_config
from workers.fsdp.shared_base import resolve_base_sharing, row_parallel_base_wanted

LORA_HYBRID = {"model": {"path": "/m", "lora_rank": 8}, "rollout": {"name": "vllm"}}


def config(share=None, **sections):
    user = {key: dict(value) for key, value in LORA_HYBRID.items()}
    for key, value in sections.items():
        user.setdefault(key, {}).update(value)
    user["rollout"]["share_base_weights"] = share
    return actor_rollout_ref_config(user)


@pytest.mark.parametrize(("sections", "reason"), [
    ({"model": {"lora_rank": 0}}, "model.lora_rank=0 trains every weight"),
    ({"rollout": {"name": "hf"}}, "rollout.name='hf' (HF generate already runs on the actor's own weights)"),
    ({"rollout": {"placement": "separate"}}, "rollout.placement='separate' (the engine must live in the actor's process"),
    ({"rollout": {"dtype": "float16"}, "model": {"dtype": "bfloat16"}}, "rollout.dtype='float16' differs from model.dtype='bfloat16'"),
    ({"rollout": {"tensor_model_parallel_size": 2, "engine_process": True}},
     "rollout.tensor_model_parallel_size=2 with rollout.engine_process=true (the engine's own processes hold its weights"),
    ({"rollout": {"tensor_model_parallel_size": 2}, "actor": {"fsdp_config": {"fsdp_size": 4}}},
     "actor.fsdp_config.fsdp_size=4: the actor's FSDP shards span 4 ranks and rollout.tensor_model_parallel_size=2 "
     "the engine's (a rank's base shard must be its engine shard: fsdp_size=2, or -1 on 2 ranks)"),
])
def test_true_where_the_config_cannot_share_names_why(sections, reason):
    with pytest.raises(ValueError, match="rollout.share_base_weights=true cannot share the actor's base weights") as error:
        config(True, **sections)
    assert reason in str(error.value) and "Set it to null (share where possible) or false" in str(error.value)
    config(None, **sections)  # null: no sharing there, no error
    config(False, **sections)


def test_null_shares_where_possible_and_false_never():
    bf16 = torch.bfloat16
    assert resolve_base_sharing(config(None), bf16, bf16) is True
    assert resolve_base_sharing(config(True), bf16, bf16) is True
    assert resolve_base_sharing(config(False), bf16, bf16) is False
    assert resolve_base_sharing(config(None, model={"lora_rank": 0}), bf16, bf16) is False
    assert resolve_base_sharing(config(None, rollout={"placement": "separate"}), bf16, bf16) is False


def test_a_tensor_parallel_engine_shares_with_an_fsdp_group_of_its_ranks():
    """One engine shard per trainer rank (the default layout): the actor's FSDP shards must span the engine's ranks,
    known on the worker for fsdp_size=-1."""
    bf16 = torch.bfloat16
    tp2 = config(None, rollout={"tensor_model_parallel_size": 2})
    assert resolve_base_sharing(tp2, bf16, bf16, shard_ranks=2) is True
    assert resolve_base_sharing(tp2, bf16, bf16, shard_ranks=4) is False
    assert resolve_base_sharing(config(None, rollout={"tensor_model_parallel_size": 2},
                                       actor={"fsdp_config": {"fsdp_size": 2}}), bf16, bf16, shard_ranks=2) is True
    with pytest.raises(ValueError, match=r"actor.fsdp_config.fsdp_size=-1: the actor's FSDP shards span 4 ranks and "
                                         r"rollout.tensor_model_parallel_size=2 the engine's \(a rank's base shard must "
                                         r"be its engine shard: fsdp_size=2, or -1 on 2 ranks\)"):
        resolve_base_sharing(config(True, rollout={"tensor_model_parallel_size": 2}), bf16, bf16, shard_ranks=4)


def test_a_mixture_of_experts_shares_at_tensor_parallel_1_only():
    """A TP2 engine splits each expert's width, FSDP the experts: nothing of the experts would be shared, so nothing
    is; at TP1 the experts are shared like the rest (the model's config tells the worker it has experts)."""
    bf16 = torch.bfloat16
    assert resolve_base_sharing(config(None), bf16, bf16, experts=True) is True
    tp2 = config(None, rollout={"tensor_model_parallel_size": 2})
    assert resolve_base_sharing(tp2, bf16, bf16, shard_ranks=2) is True
    assert resolve_base_sharing(tp2, bf16, bf16, shard_ranks=2, experts=True) is False
    assert row_parallel_base_wanted(tp2, 2) is True and row_parallel_base_wanted(tp2, 2, experts=True) is False
    with pytest.raises(ValueError, match=r"rollout.tensor_model_parallel_size=2 with a mixture of experts \(the engine "
                                         r"splits each expert's width over its ranks, FSDP splits the experts"):
        resolve_base_sharing(config(True, rollout={"tensor_model_parallel_size": 2}), bf16, bf16, shard_ranks=2,
                             experts=True)


def test_true_for_a_mixture_of_experts_at_tensor_parallel_2_is_refused_by_the_config_check(tmp_path):
    """The model folder's config.json tells the config check (before Ray starts) that the model has experts."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8}))
    moe_tp2 = {"model": {"path": str(tmp_path)}, "rollout": {"tensor_model_parallel_size": 2}}
    with pytest.raises(ValueError, match=r"rollout.tensor_model_parallel_size=2 with a mixture of experts"):
        config(True, **moe_tp2)
    config(None, **moe_tp2)  # null: no sharing, no error
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    config(True, **moe_tp2)  # a dense model at TP2 may share (fsdp_size -1: the ranks are the worker's to check)


def test_the_resolved_dtypes_must_agree():
    """model.dtype auto is bf16 on a GPU and float32 on CPU: rollout.dtype=bfloat16 agrees on one only."""
    cfg = config(None, rollout={"dtype": "bfloat16"})
    assert resolve_base_sharing(cfg, torch.bfloat16, torch.bfloat16) is True
    assert resolve_base_sharing(cfg, torch.float32, torch.bfloat16) is False
    with pytest.raises(ValueError, match=r"the engine computes in torch.bfloat16 \(rollout.dtype\) and the actor's base is torch.float32"):
        resolve_base_sharing(config(True, rollout={"dtype": "bfloat16"}), torch.float32, torch.bfloat16)


def test_the_driver_refuses_before_ray_starts(no_ray, tiny_assets, tmp_path, capsys):
    overrides = run_overrides(tiny_assets, tmp_path, "actor_rollout_ref.rollout.share_base_weights=true",
                              "actor_rollout_ref.model.lora_rank=8", "trainer.device=cpu")
    assert main(overrides) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: actor_rollout_ref.rollout.share_base_weights=true cannot share the actor's base weights with the rollout "
        "engine: actor_rollout_ref.rollout.name='hf' (HF generate already runs on the actor's own weights). Set it to null "
        "(share where possible) or false"
    ]


@pytest.mark.parametrize(("fsdp_size", "ranks", "group"), [(-1, 4, 4), (2, 4, 2), (8, 4, 4), (1, 4, 1)])
def test_one_rule_for_the_shard_group_size(fsdp_size, ranks, group):
    """The workers' mesh, the shared base's check and the memory plan read fsdp_size by one function."""
    from workers.fsdp_shard_group import shard_group_size

    assert shard_group_size(fsdp_size, ranks) == group
