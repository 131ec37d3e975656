"""The TensorDict class of `DataProto.batch`: refuses a DataProto stored under a key.

`data.batch["ref_log_prob"] = group.compute_ref(data)` reads naturally, but a DP_COMPUTE_PROTO method
returns a DataProto, and a TensorDict silently wraps any object as non-tensor data: the mistake would only
show much later (a missing tensor, a failed transport). The guarded class raises at the assignment.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict

from protocol.errors import ProtocolTypeError


def _reject_container(key: Any, value: Any) -> None:
    # By class name: this module sits below data_proto.py and must not import it.
    kind = type(value).__name__
    if kind not in ("DataProto", "DataProtoItem"):
        return
    inner = sorted(str(k) for k in value.batch.keys()) if isinstance(getattr(value, "batch", None), TensorDict) else []
    name = key if isinstance(key, str) else ".".join(key) if isinstance(key, tuple) else repr(key)
    example = inner[0] if len(inner) == 1 else "<name>"
    raise ProtocolTypeError(
        f"cannot store a {kind} in batch[{name!r}]: a batch holds tensors. Take the tensor from its batch, "
        f"e.g. data.batch[{name!r}] = output.batch[{example!r}] (the {kind}'s batch keys: {inner}); methods "
        "registered with Dispatch.DP_COMPUTE_PROTO may also return a tensor directly"
    )


class GuardedBatch(TensorDict):
    """A TensorDict whose item assignment rejects DataProto values with a message naming the key."""

    def __setitem__(self, key: Any, value: Any) -> None:
        _reject_container(key, value)
        super().__setitem__(key, value)

    def set(self, key: Any, item: Any, *args: Any, **kwargs: Any) -> Any:
        _reject_container(key, item)
        return super().set(key, item, *args, **kwargs)


def guard_batch(batch: Any) -> Any:
    """Make a plain TensorDict a GuardedBatch in place (same object, same storage; O(1)).

    Other TensorDict kinds (lazy stacks, user subclasses) are left as they are.
    """
    if type(batch) is TensorDict:
        batch.__class__ = GuardedBatch
    return batch
