"""Every key of a command (or of a user's yaml) checked against the composed config before hydra merges it, so
one message lists all that is wrong: unknown keys with the nearest existing one, verl keys with no meaning here
(trainer/verl_keys.py) with why, and the verl speed hints that are accepted and only reported."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.verl_keys import NO_EFFECT_KEYS, VERL_EQUIVALENTS, VERL_VALUES, find_verl_key, normalized

_MISSING = object()


@dataclass
class KeyReview:
    """What the checks found: the overrides to hand to hydra, the notes to print once, the problems."""

    kept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def override_parts(override: str) -> tuple[str, str | None, str]:
    """`(dotted key, value or None, prefix)` of a hydra override: `+a.b=1` -> ('a.b', '1', '+')."""
    key, has_value, value = override.partition("=")
    prefix = key[: len(key) - len(key.lstrip("+~"))]
    return key[len(prefix) :], (value if has_value else None), prefix


def dotted_keys(cfg: DictConfig) -> list[str]:
    """Every section and leaf of `cfg` as a dotted key (interpolations left as written)."""
    keys: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for name, child in node.items():
                keys.append(prefix + str(name))
                walk(child, f"{prefix}{name}.")

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return keys


def nearest_key(key: str, known: Sequence[str]) -> str:
    """The existing key most like `key`: a close spelling of the whole path, else the same last part elsewhere."""
    known = [k for k in known if not key.startswith(k + ".")]  # a section above the key is no suggestion
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    if close:
        return close[0]
    last = key.rsplit(".", 1)[-1]
    same_name = [k for k in known if k.rsplit(".", 1)[-1] == last]
    if same_name:
        return max(same_name, key=lambda k: difflib.SequenceMatcher(None, key, k).ratio())
    close_names = difflib.get_close_matches(last, sorted({k.rsplit(".", 1)[-1] for k in known}), n=1, cutoff=0.8)
    if close_names:
        return max((k for k in known if k.endswith("." + close_names[0]) or k == close_names[0]),
                   key=lambda k: difflib.SequenceMatcher(None, key, k).ratio())
    return ""


def _exists(cfg: DictConfig, key: str) -> bool:
    return OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False) is not _MISSING


def _inside_open_value(cfg: DictConfig, key: str) -> bool:
    """Whether `key` goes below a free-form mapping (a section written `{}`, such as a model's
    `override_config`, whose keys its reader checks) or below a value that is not a section (a list, a null):
    hydra and the readers report those themselves."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        parent = OmegaConf.select(cfg, ".".join(parts[:end]), default=_MISSING)
        if parent is not _MISSING:
            return not isinstance(parent, DictConfig) or len(parent) == 0
    return False


def review_keys(
    entries: Iterable[tuple[str, str | None, str, str]],
    base: DictConfig,
    adds_allowed: Callable[[str], bool],
    where: str = "",
) -> KeyReview:
    """Check `(key, value, prefix, original text)` entries against `base`. `adds_allowed(key)`: whether a `+key`
    absent from `base` is still read (a reward-manager argument, trainer/reward_settings.py). `where`: shown
    after each key (`(in my.yaml)`)."""
    review = KeyReview()
    known: list[str] | None = None
    suffix = f" ({where})" if where else ""
    for key, value, prefix, text in entries:
        shown = key if value is None else f"{key}={value}"
        if "~" in prefix:  # a deletion: hydra checks the key itself
            review.kept.append(text)
            continue
        if _exists(base, key) or _inside_open_value(base, key):
            reason = VERL_VALUES.get((key, (value or "").strip("'\"")))
            if reason is not None:
                review.problems.append(f"{shown}{suffix}: {reason}")
            elif key in NO_EFFECT_KEYS:
                review.notes.append(f"{shown}{suffix} changes nothing here: {NO_EFFECT_KEYS[key]}")
                review.kept.append(text)
            elif prefix == "+" and value is not None and _exists(base, key):
                review.kept.append(f"{key}={value}")  # verl's `+key` adds to an open dict; here the key exists
            else:
                review.kept.append(text)
            continue
        same = VERL_EQUIVALENTS.get((key, normalized(value or "")))
        if same is not None:
            review.notes.append(f"{shown}{suffix} is {same} here (taken)")
            review.kept.append(same)
            continue
        verl = find_verl_key(key)
        if verl is not None:
            if verl.is_hint(value):
                review.notes.append(f"{shown}{suffix} has no effect here: {verl.why}")
            else:
                review.problems.append(verl.line(key, value, suffix))
            continue
        if "+" in prefix and adds_allowed(key):
            review.kept.append(text)
            continue
        if known is None:
            known = dotted_keys(base)
        near = nearest_key(key, known)
        hint = f"did you mean '{near}'?" if near else valid_keys_near(base, key)
        added = " (a '+' override adds a key, but nothing reads this one)" if "+" in prefix else ""
        review.problems.append(f"unknown config key '{key}'{suffix}{added}; {hint}")
    return review


def valid_keys_near(cfg: DictConfig, key: str) -> str:
    """The keys at the deepest existing level of a dotted `key`."""
    node: Any = cfg
    walked: list[str] = []
    for part in key.split("."):
        if not (isinstance(node, DictConfig) and part in node):
            break
        node, walked = node[part], walked + [part]
    keys = sorted(node.keys()) if isinstance(node, DictConfig) else []
    return f"valid keys under {'.'.join(walked) or 'the top level'}: {keys}"
