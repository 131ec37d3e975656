"""Model FLOPs utilisation (MFU) per phase and tokens/s per GPU, as step metrics.

    perf/tflop/<phase>          model TFLOPs of the phase in this step, all GPUs together (trainer/flops.py)
    perf/mfu/<phase>            those FLOPs / (phase seconds x GPUs the phase ran on x the device's peak)
    perf/hfu/<update phase>     the same with gradient checkpointing's recomputed forward counted (only when on)
    perf/tokens_per_s_per_gpu   perf/tokens_per_s / every GPU the run reserves (perf/gpus)
    perf/device_peak_tflops     the peak MFU divides by

Phases: generate (only when this step generated its batch in the phase of that name: not with one-step-off or
asynchronous rollouts, whose generation overlaps other phases, nor with DAPO's dynamic sampling, whose extra
generation batches are not in the trained batch), old_log_prob, ref_log_prob, values, update_critic,
update_actor. Phase seconds are the driver's (`timing/<phase>_s`): they include dispatch and collect, so the
MFU is that of the phase as the run sees it, not of the kernels alone. verl's `perf/mfu/actor` is our
`perf/mfu/update_actor`, its `perf/mfu/actor_infer` our `perf/mfu/old_log_prob`.

The peak is `trainer.device_peak_tflops` when set, else the dense bf16 Tensor Core figure of the first
visible GPU's name (`PEAK_BF16_TFLOPS`); on CPU (or an unknown GPU) there is none, and the MFU metrics are left
out unless the key is set.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from trainer.flops import Flops, ModelFlops
from trainer.memory_plan.gpu import detect_gpu_name
from trainer.memory_plan.setup import lora_trainability
from trainer.memory_plan.shape import read_shape
from trainer.memory_plan.terms import Trainability

# Dense (no sparsity) bf16 Tensor Core peak in TFLOP/s by a part of the device name, most specific first (the
# first part found in the name wins: "H200" before "H20", "L40S" before "L40" before "L4"). From the vendors'
# datasheets, which print the figure "with sparsity": half of it here.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),     # GB200 NVL72: 360 PFLOPS FP16/BF16 sparse over 72 GPUs
    ("B200", 2250.0),      # HGX B200: 36 PFLOPS FP16/BF16 sparse over 8 GPUs
    ("H100 PCIe", 756.0),  # H100 datasheet: BF16 Tensor Core 1,513 TFLOPS sparse (PCIe)
    ("H100 NVL", 835.0),   # H100 datasheet: 1,671 sparse (NVL)
    ("H200 NVL", 835.0),   # H200 datasheet: 1,671 sparse (NVL)
    ("GH200", 989.0),      # GH200 datasheet: the H100 SXM's 1,979 sparse
    ("H200", 989.0),       # H200 datasheet: H200 SXM 1,979 sparse (the H100's chip); NVML: "NVIDIA H200"
    ("H100", 989.0),       # H100 datasheet: H100 SXM 1,979 sparse; NVML: "NVIDIA H100 80GB HBM3"
    ("H800", 989.0),       # H800 SXM: as the H100 SXM
    ("H20", 148.0),        # H20: 148 dense FP16/BF16
    ("A100", 312.0),       # A100 datasheet: BF16 Tensor Core 312 (624 sparse), SXM and PCIe alike
    ("A800", 312.0),       # A800: as the A100
    ("L40S", 362.0),       # L40S datasheet: 362.05 (733 sparse)
    ("L40", 181.0),        # L40 datasheet: 181.05 (362.1 sparse)
    ("L4", 121.0),         # L4 datasheet: 242 sparse
    ("MI300X", 1307.0),    # AMD Instinct MI300X: 1,307.4 dense bf16
)
PEAK_KEY = "trainer.device_peak_tflops"
TERA = 1e12


def peak_tflops_for(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name, or None for a name not in the table."""
    upper = device_name.upper()
    return next((tflops for part, tflops in PEAK_BF16_TFLOPS if part.upper() in upper), None)


def device_peak_tflops(cfg: DictConfig) -> tuple[float | None, str]:
    """(peak TFLOP/s, where it came from): the config key, else the GPU's name in the table, else None."""
    setting = OmegaConf.select(cfg, PEAK_KEY, default=None)
    if setting is not None:
        return float(setting), PEAK_KEY
    if OmegaConf.select(cfg, "trainer.device", default="auto") == "cpu":
        return None, "trainer.device=cpu"
    name = detect_gpu_name()
    if name is None:
        return None, "no GPU on the driver machine"
    peak = peak_tflops_for(name)
    return peak, name if peak is not None else f"{name} (not in trainer/perf_metrics.py's table)"


def _gpus(count: float) -> int:
    return max(1, math.ceil(count - 1e-9))  # 3 x 0.1 GPUs is 0.30000000000000004


@dataclass(frozen=True)
class GpuCounts:
    """GPUs each kind of phase runs on, and all that the run reserves (on CPU: worker processes).

    A trainer pool holds n_gpus_per_node x nnodes processes of trainer.gpus_per_process GPUs each; with
    trainer.placement=separate the critic and the reward model get a pool each. Separate vLLM engines
    (rollout.placement=separate) reserve num_engines x gpus_per_engine (or their tensor-parallel size) more;
    fractions of a GPU shared by a trainer process and an engine count once."""

    trainer: int
    rollout: int
    critic: int
    total: int

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "GpuCounts":
        settings = cfg.trainer
        per_pool = settings.n_gpus_per_node * settings.nnodes * float(settings.get("gpus_per_process", 1) or 1)
        separate_roles = settings.placement == "separate"
        has_critic = cfg.algorithm.adv_estimator == "gae"
        pools = 1 + int(separate_roles and has_critic) + int(separate_roles and bool(cfg.reward_model.enable))
        reserved = per_pool * pools
        rollout = cfg.actor_rollout_ref.rollout
        rollout_gpus = _gpus(per_pool)
        if rollout.name == "vllm" and rollout.placement == "separate":
            per_engine = float(rollout.get("gpus_per_engine") or rollout.tensor_model_parallel_size)
            engine_gpus = rollout.num_engines * per_engine
            rollout_gpus = _gpus(engine_gpus)
            reserved += engine_gpus
        return cls(trainer=_gpus(per_pool), rollout=rollout_gpus, critic=_gpus(per_pool), total=_gpus(reserved))


@dataclass(frozen=True)
class PhaseWork:
    """One phase's model FLOPs, its hardware FLOPs where they differ (recomputation), and its GPUs."""

    model: Flops
    gpus: int
    hardware: Flops | None = None


@dataclass(frozen=True)
class RunPerf:
    """What the perf metrics of a run need from its config: the models' FLOP counts, the GPUs, the peak."""

    actor: ModelFlops | None
    critic: ModelFlops | None
    gpus: GpuCounts
    peak_tflops: float | None
    actor_epochs: int = 1
    critic_epochs: int = 1
    # The share of the decoder layers gradient checkpointing recomputes (0: off; 1: all of them).
    actor_recompute: float = 0.0
    critic_recompute: float = 0.0
    count_generate: bool = True

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "RunPerf":
        """From the run's config (the models' config.json for their shapes) and the driver machine's GPU; a
        GPU whose name is not in the table is said once on stderr."""
        peak_tflops, peak_source = device_peak_tflops(cfg)
        if peak_tflops is None and peak_source.endswith("table)"):
            print(f"warning: no MFU metrics: the bf16 peak of {peak_source} is unknown; set {PEAK_KEY}",
                  file=sys.stderr)
        arr = cfg.actor_rollout_ref
        fsdp = arr.actor.strategy == "fsdp"
        critic_fsdp = cfg.critic.get("strategy", "fsdp") == "fsdp"
        critic = None
        if cfg.algorithm.adv_estimator == "gae":
            critic = _model_flops(str(cfg.critic.model.path), "critic.model.path", "value")
        actor = _model_flops(str(arr.model.path), "actor_rollout_ref.model.path", "lm", arr.model if fsdp else None)
        return cls(
            actor=actor,
            critic=critic,
            gpus=GpuCounts.from_config(cfg),
            peak_tflops=peak_tflops,
            actor_epochs=int(arr.actor.ppo_epochs),
            critic_epochs=int(cfg.critic.ppo_epochs),
            actor_recompute=_recompute_share(arr.model, actor) if fsdp else 0.0,
            critic_recompute=_recompute_share(cfg.critic.model, critic) if critic_fsdp else 0.0,
            count_generate=not bool(cfg.algorithm.filter_groups.enable),
        )

    def phase_work(self, lengths: Sequence[int], generated: Sequence[int]) -> dict[str, PhaseWork]:
        """Each phase's work for a batch of sequences of `lengths` tokens, `generated` of each sampled."""
        work: dict[str, PhaseWork] = {}
        gpus = self.gpus.trainer
        if self.actor is not None:
            if self.count_generate:
                work["generate"] = PhaseWork(self.actor.generate(lengths, generated), self.gpus.rollout)
            work["old_log_prob"] = PhaseWork(self.actor.forward(lengths), gpus)
            work["ref_log_prob"] = PhaseWork(self.actor.forward(lengths, adapters=False), gpus)
            work["update_actor"] = _update_work(self.actor, lengths, self.actor_epochs, self.actor_recompute, gpus)
        if self.critic is not None:
            work["values"] = PhaseWork(self.critic.forward(lengths), self.gpus.critic)
            work["update_critic"] = _update_work(
                self.critic, lengths, self.critic_epochs, self.critic_recompute, self.gpus.critic
            )
        return work

    def metrics(
        self, lengths: Sequence[int], generated: Sequence[int], seconds: dict[str, float], tokens_per_s: float
    ) -> dict[str, float]:
        """The perf metrics of one step: `seconds` per phase (the step's timer), `tokens_per_s` its throughput."""
        out = {"perf/gpus": float(self.gpus.total), "perf/tokens_per_s_per_gpu": tokens_per_s / self.gpus.total}
        if self.peak_tflops is not None:
            out["perf/device_peak_tflops"] = self.peak_tflops
        for phase, work in self.phase_work(lengths, generated).items():
            elapsed = seconds.get(phase)
            if elapsed is None:
                continue
            out[f"perf/tflop/{phase}"] = work.model.total / TERA
            if self.peak_tflops is None or elapsed <= 0:
                continue
            capacity = elapsed * work.gpus * self.peak_tflops * TERA
            out[f"perf/mfu/{phase}"] = work.model.total / capacity
            if work.hardware is not None:
                out[f"perf/hfu/{phase}"] = work.hardware.total / capacity
        return out


def _recompute_share(model: DictConfig, flops: ModelFlops | None) -> float:
    """The share of the decoder layers gradient checkpointing recomputes: all, or the first
    `gradient_checkpointing_layers` of them."""
    if not model.enable_gradient_checkpointing:
        return 0.0
    layers = model.get("gradient_checkpointing_layers")
    if layers is None or flops is None:
        return 1.0
    return min(int(layers), flops.shape.layers) / flops.shape.layers


def _update_work(flops: ModelFlops, lengths: Sequence[int], epochs: int, recompute: float, gpus: int) -> PhaseWork:
    """An update's model FLOPs over its epochs, and with gradient checkpointing the recomputed share on top."""
    update = flops.train(lengths) * epochs
    return PhaseWork(update, gpus, update + flops.recompute(lengths) * (epochs * recompute) if recompute else None)


def _model_flops(path: str, key: str, head: str, lora_section: DictConfig | None = None) -> ModelFlops | None:
    """The FLOP counts of the model folder at `path`, or None when its config.json is not a decoder's."""
    try:
        shape = read_shape(path, key)
    except ValueError:
        return None
    train = lora_trainability(lora_section, shape) if lora_section is not None else Trainability(full=True)
    return ModelFlops(shape, head, train.lora_rank, train.lora_targets)
