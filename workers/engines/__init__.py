"""Engine API: a user's `torch.nn.Module` (with `TrainModule`) or a model folder run as a distributed engine."""

from single_controller.need_parallel import NeedParallel
from workers.engines.engine import InferenceEngine, TrainEngine
from workers.engines.train_module import TrainModule

__all__ = ["InferenceEngine", "NeedParallel", "TrainEngine", "TrainModule"]
