"""trainer/perf_metrics.py: the device peak by name or config, the GPUs each phase divides by, the MFU metrics
of one step, and the config check of trainer.device_peak_tflops."""

from __future__ import annotations

import json
import os

import pytest

from trainer.config_loader import ConfigError, load_config
from trainer.flops import ModelFlops
from trainer.memory_plan.shape import ModelShape
from trainer.perf_metrics import GpuCounts, RunPerf, device_peak_tflops, peak_tflops_for
from trainer.tiny_model import build_tiny_model


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0), ("NVIDIA H200", 989.0),
    ("NVIDIA H200 NVL", 835.0), ("NVIDIA H20", 148.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.0),
    ("NVIDIA L40", 181.0), ("NVIDIA L4", 121.0), ("NVIDIA GH200 480GB", 989.0), ("NVIDIA B200", 2250.0),
    ("NVIDIA GeForce GTX 1080", None),
])
def test_peak_by_device_name(name, peak):
    assert peak_tflops_for(name) == peak


def test_peak_from_config_or_none_on_cpu():
    assert device_peak_tflops(load_config(["trainer.device=cpu"])) == (None, "trainer.device=cpu")
    assert device_peak_tflops(load_config(["trainer.device=cpu", "trainer.device_peak_tflops=0.5"])) == (0.5, "trainer.device_peak_tflops")
    for bad in ("0", "-3", "fast"):
        with pytest.raises(ConfigError, match="trainer.device_peak_tflops"):
            load_config([f"trainer.device_peak_tflops={bad}"])


def test_gpu_counts():
    hybrid = GpuCounts.from_config(load_config(["trainer.n_gpus_per_node=2"]))
    assert (hybrid.trainer, hybrid.rollout, hybrid.total) == (2, 2, 2)
    # Item 5's layout: the trainer on one GPU, one engine of tensor parallel 2 on two more.
    separate = load_config(["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.name=vllm",
                            "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    counts = GpuCounts.from_config(separate)
    assert (counts.trainer, counts.rollout, counts.total) == (1, 2, 3)
    # A trainer process and an engine sharing one GPU (half each) reserve one GPU, not two.
    shared = load_config(["trainer.n_gpus_per_node=1", "trainer.gpus_per_process=0.5", "actor_rollout_ref.rollout.name=vllm",
                          "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.gpus_per_engine=0.5"])
    assert GpuCounts.from_config(shared).total == 1
    # PPO with trainer.placement=separate: the critic has a pool of its own.
    ppo = GpuCounts.from_config(load_config(["algorithm=ppo", "trainer.n_gpus_per_node=2", "trainer.placement=separate"]))
    assert (ppo.critic, ppo.total) == (2, 4)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def test_step_metrics(tiny_model):
    cfg_overrides = [f"actor_rollout_ref.model.path={tiny_model}", "trainer.device=cpu", "trainer.n_gpus_per_node=2",
                     "trainer.device_peak_tflops=0.001", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                     "actor_rollout_ref.actor.ppo_epochs=2"]
    perf = RunPerf.from_config(load_config(cfg_overrides))
    lengths, generated = [20, 30, 25, 40], [8, 8, 5, 8]
    seconds = {"generate": 0.5, "old_log_prob": 0.1, "ref_log_prob": 0.1, "advantage": 0.01, "update_actor": 0.4}
    metrics = perf.metrics(lengths, generated, seconds, tokens_per_s=1000.0)
    flops = ModelFlops(ModelShape.from_config(json.loads((tiny_model / "config.json").read_text())))
    update = flops.train(lengths).total * 2  # two epochs
    assert metrics["perf/tflop/update_actor"] == pytest.approx(update / 1e12)
    assert metrics["perf/mfu/update_actor"] == pytest.approx(update / (0.4 * 2 * 0.001e12))
    recomputed = update + 2 * flops.recompute(lengths).total
    assert metrics["perf/hfu/update_actor"] == pytest.approx(recomputed / (0.4 * 2 * 0.001e12))
    assert metrics["perf/mfu/generate"] == pytest.approx(flops.generate(lengths, generated).total / (0.5 * 2 * 0.001e12))
    assert metrics["perf/mfu/old_log_prob"] == pytest.approx(metrics["perf/mfu/ref_log_prob"])  # no LoRA: same model
    assert metrics["perf/tokens_per_s_per_gpu"] == 500.0 and metrics["perf/gpus"] == 2.0
    assert "perf/mfu/advantage" not in metrics and "perf/mfu/values" not in metrics  # no FLOP count / no critic
    # the first of the tiny model's layers recomputing: that share of the recomputed forward
    layers = flops.shape.layers
    some = RunPerf.from_config(load_config([*cfg_overrides, "actor_rollout_ref.model.gradient_checkpointing_layers=1"]))
    share = some.metrics(lengths, generated, seconds, tokens_per_s=1000.0)
    partly = update + 2 * flops.recompute(lengths).total / layers
    assert layers > 1 and share["perf/hfu/update_actor"] == pytest.approx(partly / (0.4 * 2 * 0.001e12))
    # No peak (CPU, no override): FLOPs and tokens/s per GPU, no MFU.
    plain = RunPerf.from_config(load_config([f"actor_rollout_ref.model.path={tiny_model}", "trainer.device=cpu"]))
    metrics = plain.metrics(lengths, generated, seconds, tokens_per_s=1000.0)
    assert "perf/tflop/update_actor" in metrics and not [k for k in metrics if k.startswith(("perf/mfu", "perf/hfu"))]


def test_phases_left_out(tiny_model):
    """DAPO's dynamic sampling generates batches it does not train on: no generate MFU. A critic's phases
    count with a one-output head; LoRA's reference is the base without adapters."""
    dapo = RunPerf.from_config(load_config([f"actor_rollout_ref.model.path={tiny_model}", "algorithm=dapo", "trainer.device=cpu"]))
    assert "generate" not in dapo.phase_work([10], [5])
    ppo = RunPerf.from_config(load_config([f"actor_rollout_ref.model.path={tiny_model}", "algorithm=ppo", "trainer.device=cpu"]))
    work = ppo.phase_work([10, 12], [5, 6])
    assert {"values", "update_critic"} <= set(work) and work["values"].model.total < work["old_log_prob"].model.total
    lora = RunPerf.from_config(load_config([f"actor_rollout_ref.model.path={tiny_model}", "actor_rollout_ref.model.lora_rank=4",
                                            "trainer.device=cpu"]))
    work = lora.phase_work([10, 12], [5, 6])
    assert work["ref_log_prob"].model.total < work["old_log_prob"].model.total
    assert work["update_actor"].model.total < 3 * work["old_log_prob"].model.total  # frozen base: no weight gradients


def test_gpu_name_from_nvidia_smi(tmp_path, monkeypatch):
    """Without the NVML bindings (this machine) the name comes from nvidia-smi, for the first visible device."""
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB'\necho 'NVIDIA H200'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr("trainer.memory_plan.gpu._nvml_each", lambda read: None)
    cfg = load_config(["trainer.device=cuda"])
    assert device_peak_tflops(cfg) == (989.0, "NVIDIA H200")
    tool.write_text("#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB'\necho 'Mystery GPU 9000'\n")
    assert device_peak_tflops(cfg) == (None, "Mystery GPU 9000 (not in trainer/perf_metrics.py's table)")
