"""Checks run on the driver before any worker starts, so a bad path fails in seconds with one clear message
instead of minutes later inside a worker (or, worse, silently: transformers builds an empty tokenizer
from a model folder that has none)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer import run_setup
from trainer.input_errors import InputError

MEMORY_CHECK_MODES: tuple[str, ...] = ("error", "warn", "off")  # trainer.memory_check

# Any one of these makes a folder loadable by AutoTokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
# Columns every dataset file needs besides the prompt column (named by data.prompt_key).
REQUIRED_COLUMNS = ("data_source", "reward_model")


def check_model_folder(path: str, key: str = "actor_rollout_ref.model.path", tokenizer: bool = True) -> Path:
    """A local Hugging Face model folder with a config, weights and (when `tokenizer`) a tokenizer."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{key}={path!r} is not a folder (a Hugging Face model folder is expected)")
    if not (folder / "config.json").is_file():
        raise InputError(f"{key}={path!r} has no config.json; is it a Hugging Face model folder?")
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise InputError(f"{key}={path!r} holds no weights (looked for {list(WEIGHT_PATTERNS)})")
    if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(
            f"{key}={path!r} has no tokenizer (looked for any of {list(TOKENIZER_FILES)}); copy the tokenizer "
            "files of the base model into it"
        )
    return folder


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a checked model folder; it must have a chat template (prompts are chat messages)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            f"the tokenizer in {path!r} has no chat template, but the prompts are chat messages; add a "
            "chat_template.jinja (or chat_template in tokenizer_config.json) to the model folder"
        )
    return tokenizer


def check_data_files(files: Any, key: str, prompt_key: str = "prompt") -> None:
    """Every configured parquet file exists and has the columns the dataset reads (read from the file's
    schema only; the dataset checks rows when it loads them)."""
    import pyarrow.parquet as pq

    listed = [files] if isinstance(files, (str, Path)) else list(files or [])
    if not listed:
        raise InputError(f"{key} is empty; give one parquet file or a list of them")
    missing = [str(f) for f in listed if not Path(f).is_file()]
    if missing:
        raise InputError(f"{key}: no such file {missing}")
    for file in listed:
        try:
            present = pq.read_schema(file).names
        except Exception as error:  # noqa: BLE001 - any unreadable file gets the same clear message
            raise InputError(
                f"{key}: {file} is not a readable parquet file ({type(error).__name__}: {error})"
            ) from None
        for column, setting in ((prompt_key, "data.prompt_key"), *((c, None) for c in REQUIRED_COLUMNS)):
            if column not in present:
                named = (
                    f" (set {setting} to the column holding the chat messages)"
                    if setting
                    else " (verl's layout needs it)"
                )
                raise InputError(f"{key}: {file} has no column {column!r}{named}; columns present: {present}")


def check_engine_kwargs(cfg: DictConfig) -> None:
    """`rollout.engine_kwargs.vllm` names checked against the installed vLLM here, not in the engine's start."""
    rollout = cfg.actor_rollout_ref.rollout
    extra = OmegaConf.to_container(rollout.get("engine_kwargs") or {}, resolve=True)
    if rollout.name != "vllm" or not (extra or {}).get("vllm"):
        return
    from workers.rollout.engine_kwargs import vllm_engine_kwargs

    try:
        vllm_engine_kwargs(extra)
    except ValueError as error:
        raise InputError(
            str(error).replace("rollout.engine_kwargs", "actor_rollout_ref.rollout.engine_kwargs")
        ) from None


def check_lengths_fit_model(cfg: DictConfig) -> None:
    """vLLM refuses a max_model_len above the model's `max_position_embeddings`, and only inside the engine's
    worker after Ray started; the same numbers are known here from config.json."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name != "vllm":
        return
    from trainer.memory_plan.shape import language_model_config, read_model_config

    config = read_model_config(cfg.actor_rollout_ref.model.path, cfg.actor_rollout_ref.model.get("override_config"))
    positions = language_model_config(config).get("max_position_embeddings")
    if rollout.max_model_len is not None:
        length, named = int(rollout.max_model_len), f"actor_rollout_ref.rollout.max_model_len={rollout.max_model_len}"
    else:
        length = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
        named = (f"data.max_prompt_length + data.max_response_length = {cfg.data.max_prompt_length} + "
                 f"{cfg.data.max_response_length} = {length}")
    if positions is not None and length > int(positions):
        raise InputError(
            f"{named} is above the model's max_position_embeddings={positions} "
            f"({cfg.actor_rollout_ref.model.path}/config.json), which vLLM refuses; shorten the prompt or response "
            f"length, or raise it where the model allows (+actor_rollout_ref.model.override_config."
            f"max_position_embeddings={length})"
        )


def check_worker_settings(cfg: DictConfig) -> None:
    """The worker configs exactly as the workers will build them, so a bad value (rollout.temperature=hot)
    fails here, named by its full key, instead of inside a worker after Ray started."""
    from trainer.role_groups import actor_worker_config, critic_worker_config, reward_model_worker_config
    from workers.config import actor_rollout_ref_config, critic_config, reward_model_config

    checks = [
        (actor_rollout_ref_config, actor_worker_config, "actor_rollout_ref"),
        (critic_config, critic_worker_config, "critic"),
    ]
    if cfg.reward_model.enable:
        checks.append((reward_model_config, reward_model_worker_config, "reward_model"))
    for fill, section, where in checks:
        try:
            fill(section(cfg), where=where)
        except ValueError as error:
            raise InputError(str(error)) from None


def _resume_state(cfg: DictConfig) -> tuple[Path, dict[str, Any]] | None:
    from trainer.checkpointing import find_resume_dir, load_driver_state

    # Raises CheckpointError for a bad explicit path, or for `auto` when every step folder is damaged.
    path = find_resume_dir(cfg.trainer.default_local_dir, str(cfg.trainer.resume_mode), warn=False)
    return None if path is None else (path, load_driver_state(path))


def check_resume_matches(cfg: DictConfig) -> None:
    """The checkpoint the run would resume was trained with this run's LoRA settings and model shapes."""
    from trainer.resume_checks import resume_mismatch

    found = _resume_state(cfg)
    problem = None if found is None else resume_mismatch(cfg, *found)
    if problem:
        raise InputError(problem)


def resume_step(cfg: DictConfig) -> int | None:
    """The step of the checkpoint the run will resume from (`trainer.resume_mode`), or None: it starts at 0."""
    found = _resume_state(cfg)
    return None if found is None else int(found[1]["global_step"])


def finished_run(cfg: DictConfig) -> str | None:
    """Why there is nothing to train: the checkpoint resumed from is already at `trainer.total_training_steps`.
    None also while the step count is not resolved yet (null: it needs the loaded data, trainer/step_count.py)."""
    total = cfg.trainer.total_training_steps
    if total is None:
        return None
    found = _resume_state(cfg)
    if found is None or int(found[1]["global_step"]) < total:
        return None
    path, step = found[0], int(found[1]["global_step"])
    return (
        f"nothing to train: the checkpoint {path} is at step {step} and trainer.total_training_steps={total}; raise "
        "trainer.total_training_steps (or, while it is null, trainer.total_epochs) to train further, or set "
        "trainer.resume_mode=disable to start over"
    )


def memory_plan_text(cfg: DictConfig) -> str:
    """The per-GPU memory plan as a table (`trainer.plan_only=true`); needs only the models' config.json."""
    from trainer.memory_plan import build_plan, gpu_memory, render_plan

    try:
        return render_plan(build_plan(cfg, *gpu_memory(cfg)))
    except ValueError as error:
        raise InputError(str(error)) from None


def check_memory(cfg: DictConfig) -> None:
    """On a GPU run, the memory plan's fit (trainer.memory_check): one summary line and the plan's warnings (an
    engine whose KV cache holds fewer sequences than a step gives it), then for a plan that does not fit a
    warning (warn) or an InputError (error, the default); nothing on CPU or when off."""
    from trainer.memory_plan import build_plan, gpu_memory, misfit_message, summary_line
    from trainer.memory_plan.gpu import detect_gpu_bytes

    mode = cfg.trainer.get("memory_check", "error")
    device = cfg.trainer.device
    if mode == "off" or device == "cpu" or (device == "auto" and detect_gpu_bytes() is None):
        return
    try:
        plan = build_plan(cfg, *gpu_memory(cfg))
    except ValueError as error:
        raise InputError(str(error)) from None
    print(summary_line(plan))
    for warning in plan.warnings:
        print(f"warning: memory plan: {warning}", file=sys.stderr)
    if plan.fits() is False:
        if mode == "error":
            raise InputError(misfit_message(plan))
        print(f"warning: {misfit_message(plan)}", file=sys.stderr)


def _plural(count: float, noun: str) -> str:
    return f"{count:g} {noun}" + ("" if count == 1 else "s")


def check_local_gpus(cfg: DictConfig) -> None:
    """A GPU run that starts its own Ray cluster has this node alone: every GPU it reserves (the trainer pools of
    trainer.n_gpus_per_node x nnodes processes, one more per role with trainer.placement=separate, separate vLLM
    engines: perf_metrics.GpuCounts) must be among the GPUs this node shows, or Ray waits 60 s for a placement
    that cannot come and the run ends in a traceback. A run attaching to a cluster (RAY_ADDRESS, or Ray already up
    in this process) is not checked: this node is not that cluster."""
    if run_setup.ray_address() or run_setup.ray_running_here() or cfg.trainer.device == "cpu":
        return
    shown = run_setup.visible_gpu_count()
    if not run_setup.runs_on_gpu(cfg.trainer.device, shown):
        return  # trainer.device=auto without a GPU: CPU workers, any number of them
    from trainer.perf_metrics import GpuCounts

    asked = GpuCounts.from_config(cfg).total
    if asked <= shown:
        return
    per_node = cfg.trainer.n_gpus_per_node
    asks = f"trainer.n_gpus_per_node={per_node} asks for {_plural(asked, 'GPU')} per node"
    if asked != per_node:  # more than one GPU per process, several pool nodes, pools or engines: say what counts
        asks = (
            f"trainer.n_gpus_per_node={per_node} asks for {_plural(asked, 'GPU')} on this node (n_gpus_per_node x "
            "trainer.nnodes x trainer.gpus_per_process per trainer pool, a pool per role with trainer.placement="
            "separate, plus separate vLLM engines; a local Ray cluster is this one node)"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = "CUDA_VISIBLE_DEVICES unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible!r}"
    cpu = "; trainer.device=auto or cpu runs CPU workers instead" if shown == 0 else ""
    raise InputError(
        f"{asks}, but this node shows {shown} ({where}); lower trainer.n_gpus_per_node (auto: one worker per GPU "
        f"shown), make more GPUs visible, or set RAY_ADDRESS to attach to a Ray cluster that has them{cpu}"
    )


def check_ray_address(cfg: DictConfig) -> None:
    """The cluster at RAY_ADDRESS answers on its GCS port: a TCP probe until trainer.ray_connect_timeout_s, as
    init_ray's attach does first, without starting Ray. Addresses only Ray resolves (`auto`, `ray://...`, a
    dashboard URL) are left to init_ray."""
    address = run_setup.ray_address()
    if address is None or run_setup.ray_running_here():
        return
    from single_controller.ray.attach import ClusterUnreachable, split_address, wait_for_gcs

    if split_address(address) is None:
        return
    try:
        wait_for_gcs(address, cfg.trainer.get("ray_connect_timeout_s", run_setup.DEFAULT_CONNECT_TIMEOUT_S))
    except ClusterUnreachable as error:
        raise InputError(str(error)) from None


def check_inputs(cfg: DictConfig) -> str | None:
    """Every driver-side check of `cfg`'s paths, data files and rows, reward function, trackers, GPUs, checkpoint
    and worker settings, before Ray starts (the file checks first: they need no torch). Returns why there is nothing
    to train (the resumed checkpoint is already at the last step), or None. That is decided last: a finished run
    with a mistake in its settings, or a RAY_ADDRESS where nothing answers, reports the mistake (exit 2), not
    "nothing to train" (exit 0)."""
    from trainer.batch_checks import check_batch_split
    from trainer.data_checks import check_rows, reward_needs
    from trainer.image_checks import check_images
    from trainer.moe_checks import moe_lora_rollout_problem
    from trainer.package_checks import check_packages
    from trainer.trackers import check_entries

    check_model_folder(cfg.actor_rollout_ref.model.path)
    data_keys = [("data.train_files", cfg.data.train_files)]
    if cfg.data.val_files:
        data_keys.append(("data.val_files", cfg.data.val_files))
    for key, files in data_keys:
        check_data_files(files, key, cfg.data.prompt_key)
    needs = reward_needs(cfg)
    for key, files in data_keys:
        check_rows(files, key, cfg.data.prompt_key, needs)
    check_images(cfg, data_keys)
    if cfg.reward_model.enable and cfg.reward_model.model.path:
        check_model_folder(cfg.reward_model.model.path, "reward_model.model.path", tokenizer=False)
    check_entries(list(cfg.trainer.logger))
    check_local_gpus(cfg)  # before the batch split: with too few GPUs, the worker count is what to change first
    check_worker_settings(cfg)
    check_batch_split(cfg)
    check_resume_matches(cfg)
    check_packages(cfg)
    check_engine_kwargs(cfg)
    check_lengths_fit_model(cfg)
    moe_lora = moe_lora_rollout_problem(cfg)
    if moe_lora:
        raise InputError(moe_lora)
    check_memory(cfg)  # NVML only (no CUDA context); nothing on CPU
    return nothing_to_train(cfg)


def check_plan_inputs(cfg: DictConfig) -> None:
    """The checks of `trainer.plan_only=true`: those of the settings themselves, which a run would make before Ray,
    without the ones of this machine (its GPUs, packages, data files), since a plan is often made elsewhere."""
    from trainer.batch_checks import check_batch_split

    check_worker_settings(cfg)
    check_batch_split(cfg)
    check_engine_kwargs(cfg)
    check_lengths_fit_model(cfg)


def nothing_to_train(cfg: DictConfig) -> str | None:
    """`finished_run`, after probing RAY_ADDRESS when there is nothing to train: a run that trains finds a dead
    address when init_ray attaches (after the tracker started, where Ctrl-C reports the step); one that stops here
    would never reach it. Called again once the data resolved a null trainer.total_training_steps."""
    nothing_to_do = finished_run(cfg)
    if nothing_to_do:
        check_ray_address(cfg)
    return nothing_to_do
