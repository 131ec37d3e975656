"""benchmarks/async_rl.py's GPU long-tail run through the config, on CPU (the issue "[Side by side at 7B]", item
4): with `--gpus 2` the actor and the engine each get a GPU and the weights go by NCCL broadcast, with `--gpus 1`
they share one by CUDA IPC; every mode's config passes the checks made before Ray starts, the engine captures
CUDA graphs up to what the asynchronous stream decodes at once, and the run is long enough to measure."""

from __future__ import annotations

import pytest

from benchmarks.async_rl import DEFAULT_STEPS, GPU_LAYOUTS, MODES, SEPARATE, gpu_longtail_overrides
from benchmarks.model_shapes import QWEN2_0_5B
from benchmarks.random_model import write_config
from single_controller.worker import NodeInfo
from trainer.batch_checks import batch_split_problems
from trainer.config_loader import load_config
from trainer.memory_plan import GIB, build_plan
from trainer.perf_metrics import GpuCounts
from trainer.preflight import check_worker_settings
from trainer.role_groups import engine_decode_batch
from workers.rollout.sync_path import CUDA_IPC, NCCL, choose_sync_path

H100_GIB = 79.6


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    model = tmp_path_factory.mktemp("qwen2_0_5b")
    write_config(model, QWEN2_0_5B)
    return gpu_longtail_overrides(model, model / "train.parquet", model / "val.parquet", 1024)


def config(settings: list[str], gpus: int, mode: str):
    return load_config([*settings, *SEPARATE, *MODES[mode], *GPU_LAYOUTS[gpus]])


def test_the_gpu_run_is_long_enough_to_measure():
    assert DEFAULT_STEPS["gpu-longtail"] >= 14  # steps 3..N are the steady state; a long group comes every few steps


@pytest.mark.parametrize("gpus", sorted(GPU_LAYOUTS))
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_passes_the_checks(settings, gpus, mode):
    cfg = config(settings, gpus, mode)
    check_worker_settings(cfg)
    assert batch_split_problems(cfg) == []
    assert build_plan(cfg, int(H100_GIB * GIB)).fits() is True


def test_two_gpus_give_the_engine_its_own_and_sync_by_broadcast(settings):
    cfg = config(settings, 2, "async2")
    counts = GpuCounts.from_config(cfg)
    assert (counts.trainer, counts.rollout, counts.total) == (1, 1, 2)
    trainer = [NodeInfo(0, "node", "127.0.0.1", 1, ("0",))]
    engine = [NodeInfo(0, "node", "127.0.0.1", 1, ("1",))]
    assert choose_sync_path(trainer, engine, use_gpu=True, infer_tp=1).kind == NCCL


def test_one_gpu_shares_it_and_syncs_by_cuda_ipc(settings):
    cfg = config(settings, 1, "async2")
    assert GpuCounts.from_config(cfg).total == 1
    shared = [NodeInfo(0, "node", "127.0.0.1", 1, ("0",))]
    assert choose_sync_path(shared, shared, use_gpu=True, infer_tp=1).kind == CUDA_IPC


@pytest.mark.parametrize(
    ("mode", "decode_batch"), [("sync", 128), ("one_step_off", 128), ("async1", 256), ("async2", 384), ("async4", 640)]
)
def test_graphs_cover_what_the_engine_decodes_at_once(settings, mode, decode_batch):
    # 16 prompts x 8 responses per batch; the asynchronous stream keeps max_staleness + 1 batches out.
    assert engine_decode_batch(config(settings, 2, mode)) == decode_batch


def test_the_summary_says_where_a_steady_step_goes():
    from benchmarks.async_rl import summarize

    def record(step: int, wall: float, phases: dict[str, float]) -> dict[str, float]:
        timings = {f"timing/{phase}_s": seconds for phase, seconds in phases.items()}
        return {"step": step, "timing/wall_step_s": wall, "timing/step_s": sum(phases.values()), "perf/tokens": 100,
                "reward/mean": 0.0, "overhead/dispatch_collect_s": 0.01 * step, **timings}

    history = [record(1, 9.0, {"sync_weights": 0.0, "wait_rollout": 8.0, "update_actor": 0.5}),  # the pipeline's fill
               record(2, 3.0, {"sync_weights": 0.2, "wait_rollout": 0.1, "update_actor": 2.0}),
               record(3, 3.0, {"sync_weights": 0.2, "wait_rollout": 0.3, "update_actor": 2.0}),
               record(4, 4.0, {"sync_weights": 0.4, "wait_rollout": 0.5, "update_actor": 2.0})]
    summary = summarize(history)
    steady = history[2:]  # steps 3..N
    assert summary["step_s"] == pytest.approx(3.5)
    assert summary["sync_weights_s"] == pytest.approx(0.3) and summary["wait_rollout_s"] == pytest.approx(0.4)
    outside = [r["timing/wall_step_s"] - r["timing/step_s"] for r in steady]
    assert summary["outside_phases_s"] == pytest.approx(sum(outside) / len(outside))
    assert summary["dispatch_collect_s"] == pytest.approx(0.035)
    assert summary["tokens_per_s"] == pytest.approx(400 / 19.0)  # every step, the fill included
    assert summary["generate_s"] != summary["generate_s"]  # no generate phase in an asynchronous run: NaN


@pytest.mark.parametrize("mode", ["sync", "async2"])
def test_the_7b_preset_fits_two_h200s_with_the_actor_offloaded(tmp_path, mode):
    """gpu-7b: the 7B actor (full fine-tune) offloads its state between phases on one GPU, the engine has the other;
    the plan's peak (the optimizer step, ~122 GiB) fits an H200's 139.8 GiB, not an H100."""
    from benchmarks.async_rl import SEVEN_B_ACTOR
    from benchmarks.model_shapes import QWEN2_7B

    write_config(tmp_path, QWEN2_7B)
    cfg = load_config([*gpu_longtail_overrides(tmp_path, tmp_path / "t.parquet", tmp_path / "v.parquet", 1024), *SEVEN_B_ACTOR,
                       *SEPARATE, *MODES[mode], *GPU_LAYOUTS[2]])
    check_worker_settings(cfg)
    assert batch_split_problems(cfg) == []
    offload = cfg.actor_rollout_ref.actor.fsdp_config
    assert offload.param_offload and offload.optimizer_offload
    assert build_plan(cfg, int(139.8 * GIB)).fits() is True
    assert build_plan(cfg, int(H100_GIB * GIB)).fits() is False


def test_the_7b_preset_refuses_one_gpu(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "benchmarks.async_rl", "--preset", "gpu-7b", "--gpus", "1", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--preset gpu-7b needs --gpus 2" in done.stderr


def test_the_driver_profile_names_where_the_driver_spent_its_time(tmp_path):
    from benchmarks.driver_profile import driver_profile

    def busy_driver_work():
        return sum(i * i for i in range(200_000))

    with driver_profile(tmp_path / "prof", "async2_seed0"):
        busy_driver_work()
    with driver_profile(None, "off"):  # no folder: nothing profiled, nothing written
        busy_driver_work()
    assert sorted(p.name for p in (tmp_path / "prof").iterdir()) == ["async2_seed0.prof", "async2_seed0.stacks.txt", "async2_seed0.txt"]
    text = (tmp_path / "prof" / "async2_seed0.txt").read_text()
    assert "busy_driver_work" in text and text.startswith("garbage collection pauses: ")


def test_the_collectors_pauses_are_counted_per_generation():
    import gc

    from benchmarks.driver_profile import GcPauses

    pauses = GcPauses()
    with pauses.installed():
        gc.collect(2)
        gc.collect(0)
    assert pauses.counts[2] >= 1 and pauses.counts[0] >= 1 and pauses.seconds[2] > 0
    assert pauses not in gc.callbacks  # removed again
    assert pauses.summary().startswith("garbage collection pauses: ")


def test_the_stack_sampler_shows_a_waiting_main_thread_and_what_held_it_up():
    import threading
    import time

    from benchmarks.driver_profile import StackSampler

    def background_spin(stop):
        while not stop.is_set():
            sum(i for i in range(1000))

    def _wait_for_batch(seconds):  # the focus function's name, as in trainer/async_rollout.py
        time.sleep(seconds)

    stop = threading.Event()
    spinner = threading.Thread(target=background_spin, args=(stop,), name="spinner")
    sampler = StackSampler(focus="_wait_for_batch", interval_s=0.005)
    with sampler.running():
        spinner.start()
        _wait_for_batch(0.3)
        time.sleep(0.1)  # outside the focus
        stop.set()
        spinner.join()
    focused = sum(sampler.focused.values())
    assert 10 <= focused < sampler.samples
    assert all("_wait_for_batch" in stack for stack in sampler.focused)
    assert any(stack.startswith("[spinner]") and "background_spin" in stack for stack in sampler.others_in_focus)
    text = sampler.summary()
    assert "== main thread inside _wait_for_batch" in text and "== thread spinner" in text
