"""Fixtures shared with the worker and end-to-end tests (same definitions, imported so they are reused), and runs
shared by several rollout test modules (each checks its own facts of the same run)."""

import pytest

from tests.e2e.conftest import run_overrides
from tests.workers.conftest import pool_2, tiny_model_dir  # noqa: F401

# LoRA on two actor ranks with vLLM, every sync verified (test_vllm_lora.py, test_lora_shared_base.py). Two steps: the
# second starts with a sync of the first update, every check of a sync has one to check.
LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.actor.optim.lr=2e-2")
VLLM_TWO_RANKS = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.verify_sync=true", "trainer.n_gpus_per_node=2")
SHORT_RUN = ("trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_at_end=false")
EXPORT = ("trainer.export_hf_at_end=true",)  # the trained adapter, for test_lora_shared_base.py's comparison


@pytest.fixture(scope="session")
def lora_hybrid_run(ray_cluster, tiny_assets, tmp_path_factory):
    """(history, output folder) of one LoRA GRPO run with a hybrid vLLM engine per rank, at the default
    rollout.share_base_weights (null: shared where possible, as here). test_vllm_lora.py checks its adapter-only
    syncs and test_lora_shared_base.py compares it with a run that does not share: one run and engine start less."""
    from trainer.config_loader import load_config
    from trainer.main import run

    out = tmp_path_factory.mktemp("lora_hybrid_run")
    return run(load_config(run_overrides(tiny_assets, out, *LORA, *VLLM_TWO_RANKS, *SHORT_RUN, *EXPORT))), out
