"""The reward settings the driver acts on (verl's layout): `reward_model.reward_manager`, the overlong buffer
(`reward_model.overlong_buffer`, or verl's manager arguments `reward_model.reward_kwargs.overlong_buffer_cfg` and
`.max_resp_len`) and their checks. Free of torch: the config loader imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

# The reward managers there are (reward_model.reward_manager): the one registry of their names; the classes
# are in trainer/rewards/managers.py under the same names.
REWARD_MANAGERS: dict[str, str] = {
    "naive": "the rule scorers: custom_reward_function, else the built-in one of each data_source",
    "dapo": "naive plus DAPO's overlong buffer (reward_model.overlong_buffer)",
}
OVERLONG_KEY = "reward_model.overlong_buffer"
KWARGS_KEY = "reward_model.reward_kwargs"
# verl's DAPO manager arguments, as its scripts pass them (`+reward_model.reward_kwargs.<key>=...`).
OVERLONG_FIELDS = ("enable", "len", "penalty_factor", "log")
REWARD_KWARGS = ("max_resp_len", *(f"overlong_buffer_cfg.{name}" for name in OVERLONG_FIELDS))


@dataclass(frozen=True)
class OverlongBuffer:
    """The penalty the dapo manager adds: linear over the last `length` tokens before `limit`."""

    length: int
    penalty_factor: float
    limit: int  # the response length the buffer ends at (verl's max_resp_len)
    log: bool  # report the penalty metrics each step


def declared_reward_kwarg(dotted: str) -> bool:
    """Whether `dotted` (e.g. `reward_model.reward_kwargs.max_resp_len`) is a reward-manager argument read here."""
    prefix = KWARGS_KEY + "."
    return dotted.startswith(prefix) and dotted[len(prefix):] in REWARD_KWARGS


def _kwargs(cfg: DictConfig) -> dict[str, Any]:
    node = OmegaConf.select(cfg, KWARGS_KEY)
    return {} if node is None else dict(OmegaConf.to_container(node, resolve=True))


def _overlong_source(cfg: DictConfig) -> tuple[str, Any]:
    """Where the overlong settings come from: verl's `reward_kwargs.overlong_buffer_cfg` when given, else
    `reward_model.overlong_buffer`; (its dotted key, its node)."""
    given = _kwargs(cfg).get("overlong_buffer_cfg")
    if given is not None:
        return f"{KWARGS_KEY}.overlong_buffer_cfg", given
    return OVERLONG_KEY, OmegaConf.select(cfg, OVERLONG_KEY)


def overlong_buffer(cfg: DictConfig) -> OverlongBuffer | None:
    """The overlong buffer the run applies (the dapo manager with the buffer on); None otherwise."""
    if OmegaConf.select(cfg, "reward_model.reward_manager", default="naive") != "dapo":
        return None
    _, settings = _overlong_source(cfg)
    if settings is None or not settings.get("enable", False):
        return None
    limit = _kwargs(cfg).get("max_resp_len") or cfg.data.max_response_length
    factor, log = float(settings.get("penalty_factor", 1.0)), bool(settings.get("log", False))
    return OverlongBuffer(int(settings["len"]), factor, int(limit), log)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flat(kwargs: dict[str, Any]) -> list[str]:
    """The dotted keys of reward_kwargs, one level of nesting deep (overlong_buffer_cfg.len)."""
    return [key for k, v in kwargs.items() for key in ([f"{k}.{sub}" for sub in v] if isinstance(v, dict) else [k])]


def _check_kwargs(cfg: DictConfig, manager: str) -> list[str]:
    kwargs = _kwargs(cfg)
    if not kwargs:
        return []
    given = _flat(kwargs)
    unknown = sorted(set(given) - set(REWARD_KWARGS))
    if unknown:
        return [f"{KWARGS_KEY} has unknown keys {unknown}; valid: {list(REWARD_KWARGS)} (the dapo manager's arguments)"]
    if manager != "dapo":
        return [f"{KWARGS_KEY} {sorted(given)} are arguments of reward_model.reward_manager=dapo, not {manager!r}; "
                "set reward_model.reward_manager=dapo"]
    problems = []
    limit = kwargs.get("max_resp_len")
    if limit is not None and (not is_int(limit) or limit < 2):
        problems.append(f"{KWARGS_KEY}.max_resp_len={limit!r} must be an integer >= 2 (the response length the "
                        "overlong buffer ends at; unset: data.max_response_length)")
    if "overlong_buffer_cfg" in kwargs and OmegaConf.select(cfg, f"{OVERLONG_KEY}.enable") is True:
        problems.append(f"{KWARGS_KEY}.overlong_buffer_cfg and {OVERLONG_KEY}.enable=true set the same overlong "
                        "buffer twice; keep one of them")
    return problems


def _check_overlong(cfg: DictConfig, manager: str) -> list[str]:
    key, settings = _overlong_source(cfg)
    if settings is None:
        return []
    enable = settings.get("enable", False)
    if not isinstance(enable, bool):
        return [f"{key}.enable={enable!r} must be true or false"]
    log = settings.get("log", False)
    problems = [] if isinstance(log, bool) else [f"{key}.log={log!r} must be true or false"]
    if not enable:
        return problems
    if manager != "dapo":
        return problems + [f"{key}.enable=true applies with reward_model.reward_manager=dapo (the naive manager has "
                           f"no overlong buffer); set reward_model.reward_manager=dapo"]
    limit = _kwargs(cfg).get("max_resp_len") or cfg.data.max_response_length
    where = f"{KWARGS_KEY}.max_resp_len" if _kwargs(cfg).get("max_resp_len") else "data.max_response_length"
    length = settings.get("len")
    if is_int(limit) and (not is_int(length) or not 0 < length < limit):
        problems.append(f"{key}.len={length!r} must be an integer in 1..{limit - 1}: the last tokens before "
                        f"{where}={limit} over which the penalty grows")
    factor = settings.get("penalty_factor", 1.0)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor < 0:
        problems.append(f"{key}.penalty_factor={factor!r} must be a number >= 0 (the penalty at the length limit)")
    return problems


def check_reward_settings(cfg: DictConfig) -> list[str]:
    """Problems with reward_model.reward_manager, its overlong buffer and reward_kwargs (a recipe config without a
    reward_model section has nothing to check)."""
    if OmegaConf.select(cfg, "reward_model") is None:
        return []
    manager = OmegaConf.select(cfg, "reward_model.reward_manager", default="naive")
    if manager not in REWARD_MANAGERS:
        return []  # the config loader's choice check names it
    return _check_kwargs(cfg, manager) or _check_overlong(cfg, manager)  # bad kwargs: the buffer is not read
