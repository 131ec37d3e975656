"""verl's `checkpoint.save_contents` / `load_contents` (actor and critic): what they may say here. A checkpoint
always holds the model, the optimizer and the extra state (RNG, scheduler), and a resume loads all three, so that a
resumed run continues exactly (a list without one of them is accepted with a note saying so); `hf_model` adds
the role's Hugging Face model to each checkpoint (RoleGroups.save)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

ALWAYS = ("model", "optimizer", "extra")
OPTIONAL = ("hf_model",)
SECTIONS = ("actor_rollout_ref.actor.checkpoint", "critic.checkpoint")


def _entries(cfg: DictConfig) -> list[tuple[str, list[str], tuple[str, ...]]]:
    """`(dotted key, its items, the items it may hold)` of each contents key."""
    entries = []
    for section in SECTIONS:
        for key, allowed in (("save_contents", ALWAYS + OPTIONAL), ("load_contents", ALWAYS)):
            value = OmegaConf.select(cfg, f"{section}.{key}")
            items = list(value) if OmegaConf.is_list(value) or isinstance(value, list) else [value]
            entries.append((f"{section}.{key}", items, allowed))
    return entries


def checkpoint_contents_problems(cfg: DictConfig) -> list[str]:
    """Items this project does not know; an empty list (nothing saved or loaded) is one too."""
    return [
        f"{key}={items}: valid items are {list(allowed)}" for key, items, allowed in _entries(cfg)
        if not items or any(item not in allowed for item in items)
    ]


def checkpoint_contents_notes(cfg: DictConfig) -> list[str]:
    """A list without all of model, optimizer and extra is accepted and told that all three are kept anyway (a
    smaller checkpoint is verl's choice; here every checkpoint can resume exactly)."""
    return [
        f"{key}={items} also holds {[item for item in ALWAYS if item not in items]} here: a checkpoint always holds "
        f"{list(ALWAYS)}, so a resume continues exactly"
        for key, items, _ in _entries(cfg) if any(item not in items for item in ALWAYS)
    ]
