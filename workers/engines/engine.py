"""`TrainEngine` and `InferenceEngine`: a user's module, or a model folder, run as a distributed engine on
the worker groups and resource pools of `single_controller` (no second scheduler).

    infer = InferenceEngine(model_path, executor="vllm").build(tensor_parallel_size=1)
    outputs = infer.generate(NeedParallel(prompts), {"temperature": 0.0, "max_tokens": 32})
    infer.meta()                                        # free its memory while training
    with init_empty_weights():
        policy = Policy(AutoConfig.from_pretrained(model_path))
    train = TrainEngine(policy).build(colocate_with=infer)
    train.train_step(NeedParallel(batch), 1.0)          # every public method of Policy, per-worker results
    train.optimizer_step()
    infer.cuda()
    train.p2p_weight_sync(infer)                         # verified against the trainer's log-probs
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

EXECUTORS_TRAIN = ("fsdp2",)
EXECUTORS_INFER = ("vllm", "hf")


class _GroupHandle:
    """What both engines are on the driver: a worker group on a resource pool, made by `build()`."""

    group: RayWorkerGroup | None = None
    pool: RayResourcePool | None = None
    _owns_pool = True  # a train engine built with colocate_with runs on the inference engine's pool

    def _require_group(self) -> RayWorkerGroup:
        if self.group is None:
            raise RuntimeError("call build() first")
        return self.group

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()  # an engine's shared memory and processes go before the kill (Worker.close)
            self.group.kill()
        if self.pool is not None and self._owns_pool:
            self.pool.release()
        self.group = self.pool = None


class InferenceEngine(_GroupHandle):
    def __init__(self, model_path: str, executor: str = "vllm", **rollout_options: Any) -> None:
        if executor not in EXECUTORS_INFER:
            raise ValueError(f"InferenceEngine executor {executor!r} is not available; valid: {list(EXECUTORS_INFER)}")
        self.model_path, self.executor, self.options = model_path, executor, rollout_options
        self.incarnation = 0  # bumped by meta(): a released engine may come back as a new vLLM instance

    def build(self, tensor_parallel_size: int = 1, num_engines: int = 1, colocate_with: Any = None,
              use_gpu: bool | None = None) -> "InferenceEngine":
        use_gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
        if self.executor == "hf":
            from workers.engines.hf_inference_worker import HFInferenceWorker as worker_class

            if tensor_parallel_size != 1:
                raise ValueError(
                    "executor 'hf' runs one whole model per engine; "
                    f"tensor_parallel_size must be 1, got {tensor_parallel_size}"
                )
        else:
            from workers.rollout.vllm_worker import VLLMRolloutWorker as worker_class
        rollout = {"name": "vllm", "placement": "separate", "tensor_model_parallel_size": tensor_parallel_size,
                   "num_engines": num_engines, **self.options}
        config = {"model": {"path": self.model_path}, "rollout": rollout}
        self.pool = colocate_with.pool if colocate_with is not None else RayResourcePool(
            [num_engines], use_gpu=use_gpu, name_prefix="infer_", gpus_per_process=tensor_parallel_size)
        self.use_gpu = use_gpu
        self.tensor_parallel_size = tensor_parallel_size
        self.group = RayWorkerGroup(self.pool, RayClassWithInitArgs(worker_class, config=config), name_prefix="infer")
        self.group.init_model()
        return self

    def generate(self, prompts: Any, sampling: dict[str, Any] | None = None) -> list[Any]:
        """`prompts`: token-id lists (wrap in NeedParallel to split them over the engines); per-engine results."""
        return self._require_group().generate_tokens(prompts, sampling or {})

    def log_probs_of_probe(self, vocab_size: int) -> list[torch.Tensor]:
        return self._require_group().probe_log_probs(vocab_size)

    # ---- residency ------------------------------------------------------------------------------------
    def meta(self) -> "InferenceEngine":
        """Release the weights and the KV cache (vLLM on GPU: sleep; otherwise the engine is shut down)."""
        self._require_group().release()
        self.incarnation += 1
        return self

    def cuda(self, what: str = "all") -> "InferenceEngine":
        """Bring back "weights", "kv_cache" or "all" (on CPU: rebuild the engine on its device)."""
        self._require_group().restore(what)
        return self


class TrainEngine(_GroupHandle):
    def __init__(self, module: Any, executor: str = "fsdp2", sync_dtype: str = "auto", bucket_mb: int = 512) -> None:
        if executor not in EXECUTORS_TRAIN:
            raise ValueError(f"TrainEngine executor {executor!r} is not available; valid: {list(EXECUTORS_TRAIN)}")
        from workers.engines.train_module import TrainModule

        if not isinstance(module, TrainModule):
            raise TypeError(
                f"{type(module).__name__} must subclass workers.engines.TrainModule (next to its model class)"
            )
        from workers.engines.materialize import clear_stale_requires_grad

        clear_stale_requires_grad(module)  # what trains on the workers is what trains here
        self.module, self.executor = module, executor
        self.worker_args = {"sync_dtype": sync_dtype, "bucket_mb": bucket_mb}
        self._owns_pool = False
        self.missing_parameters: list[str] = []
        self.released = False
        self._syncs: dict[tuple[int, int], Any] = {}  # the connected sync of the last engine synced
        self.sync_path: str | None = None  # the path of that sync: "cuda_ipc", "nccl" or "gloo"

    def build(self, world_size: int = 1, colocate_with: Any = None, use_gpu: bool | None = None) -> "TrainEngine":
        """One FSDP2 rank per process; with `colocate_with`, on that engine's processes' slots."""
        from workers.engines.module_worker import ModuleWorker

        if colocate_with is not None:
            self.pool, self.use_gpu = colocate_with.pool, colocate_with.use_gpu
        else:
            self.use_gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
            self.pool, self._owns_pool = RayResourcePool([world_size], use_gpu=self.use_gpu, name_prefix="train_"), True
        self.group = RayWorkerGroup(
            self.pool, RayClassWithInitArgs(ModuleWorker, **self.worker_args), name_prefix="train"
        )
        self._materialize()
        return self

    def _materialize(self) -> None:
        self.missing_parameters = self.group.materialize(self.module)[0]
        self.released = False

    def __getattr__(self, name: str) -> Callable[..., list[Any]]:
        # Only called for names not found normally: the user's module methods.
        if name.startswith("_") or name in ("module", "group", "pool"):
            raise AttributeError(name)
        method = getattr(type(self.module), name, None)
        if method is None or not inspect.isfunction(method):
            public = sorted(
                n for n, v in vars(type(self.module)).items() if inspect.isfunction(v) and not n.startswith("_")
            )
            raise AttributeError(
                f"{type(self.module).__name__} has no public method {name!r}; its own methods: {public}"
            )

        def call(*args: Any, **kwargs: Any) -> list[Any]:
            if self.released:
                raise RuntimeError(f"{name}: the train engine was released with .meta(); call .cuda() first")
            return self._require_group().call_module(name, *args, **kwargs)

        return call

    # ---- residency ------------------------------------------------------------------------------------
    def cpu(self) -> "TrainEngine":
        """Parameters and optimizer state to host memory (on a GPU; nothing moves on CPU)."""
        self._require_group().to_host()
        return self

    def cuda(self) -> "TrainEngine":
        """Back on the device; after `.meta()`, re-materialized from the module's source checkpoint."""
        if self.released:
            self._materialize()
        else:
            self._require_group().to_device()
        return self

    def meta(self) -> "TrainEngine":
        """Release everything (weights, gradients, optimizer); training state not saved is lost."""
        self._require_group().release()
        self.released = True
        return self

    def state_dict(self, exported: bool = False) -> dict[str, torch.Tensor]:
        """The full parameters (module names), or with `exported` the tensors an inference engine receives."""
        return self._require_group().full_state(exported)[0]

    # ---- weights to an inference engine ---------------------------------------------------------------
    def p2p_weight_sync(
        self, infer: InferenceEngine, verify: bool = True, tolerance: float | None = None
    ) -> dict[str, float]:
        """Send the exported weights (output hook applied) to every engine of `infer`, by the path their
        placement allows (`sync_path`): CUDA IPC when the engines share the train ranks' GPUs, a bucketed
        NCCL broadcast from rank 0 when they are on other GPUs, gloo on CPU. With `verify`, each engine's
        log-probs of a probe batch must match this module's."""
        from workers.rollout.separate_sync import IpcRolloutSync, SeparateWeightSync
        from workers.rollout.sync_path import CUDA_IPC, choose_sync_path

        key = (id(infer), infer.incarnation)  # a rebuilt engine has to be connected anew
        if key not in self._syncs:
            train, engines = self._require_group(), infer._require_group()
            path = choose_sync_path(train.node_info, engines.node_info, self.use_gpu, infer.tensor_parallel_size)
            self.sync_path = path.kind
            options = {"tensor_model_parallel_size": infer.tensor_parallel_size, "verify_sync": verify,
                       "verify_tolerance": tolerance}
            # The engine may have loaded other weights than the module holds: the first call always sends, and is
            # not checked for a change of weights (later ones are, against the module's fingerprint of what it
            # sends).
            if path.kind == CUDA_IPC:
                sync = IpcRolloutSync(
                    train, engines, path.feeding_rank, options, infer.model_path, engines_start_from_trainer=False
                )
            else:
                sync = SeparateWeightSync(
                    train, engines, options, infer.model_path, self.use_gpu, engines_start_from_trainer=False
                )
            self._syncs = {key: sync}
        return self._syncs[key].sync()
