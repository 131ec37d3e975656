"""Rule-based rewards: per-task scorers, a data_source table, config loading, and the batch manager."""

from .char_class import CHAR_CLASSES, compute_char_class_score, parse_char_class_target
from .loader import load_reward_function
from .manager import RuleRewardManager, last_valid_positions
from .math_answer import compute_math_answer_score, extract_answer
from .registry import SCORERS, compute_score

__all__ = [
    "CHAR_CLASSES",
    "SCORERS",
    "RuleRewardManager",
    "compute_char_class_score",
    "compute_math_answer_score",
    "compute_score",
    "extract_answer",
    "last_valid_positions",
    "load_reward_function",
    "parse_char_class_target",
]
