"""The memory plan's init row with rollout.verify_sync: the hybrid engine's first check fingerprints the actor's
initial weights, so the actor is on the GPU while the engine starts (7B full fine-tuning on an H200: 105.8 GiB
measured where the plan without it said 70.9)."""

from __future__ import annotations

import json

import pytest

from tests.trainer.memory_plan_cases import GIB, QWEN_7B, part, plan_of, scale_config
from trainer.memory_plan.shape import ModelShape

CHECKED = "actor_rollout_ref.rollout.verify_sync=true"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A model folder holding only the Qwen2.5-7B config.json (all the plan reads)."""
    root = tmp_path_factory.mktemp("sync_check_models") / "7B"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(QWEN_7B))
    return str(root)


def test_the_sync_check_keeps_the_offloaded_actor_in_while_the_engine_starts(model):
    params = ModelShape.from_config(QWEN_7B).total_params()
    plain, checked = plan_of(scale_config(model)), plan_of(scale_config(model, CHECKED))
    assert plain.row("init").moment == "vLLM engine started" and part(plain, "init", "weights") == 0
    assert checked.row("init").moment == "vLLM engine started, actor in (sync check)"
    assert part(checked, "init", "weights") == pytest.approx(4 * params / GIB)  # float32 master weights
    assert part(checked, "init", "engine") == part(plain, "init", "engine")
    # The engine awake with the actor in, as at the generate's weight sync (less the sync's buffers).
    assert checked.row("init").total <= checked.row("generate").total
    assert checked.row("init").total / GIB == pytest.approx(99.3, abs=1.0)  # the measured 105.8 less 5.4 GiB of
    # fingerprint temporaries, which a chunked sum no longer makes


def test_a_lora_sync_check_brings_only_the_adapters(model):
    shared = plan_of(scale_config(model, CHECKED, lora_rank=64))
    plain = plan_of(scale_config(model, lora_rank=64))
    extra = shared.row("init").total - plain.row("init").total
    assert 0 < extra / GIB < 1.0  # float32 adapters of rank 64 (0.3 GiB), not the 14.2 GiB base
