"""Train and score one ``ArchConfig``: short proxy runs (``proxy.run``) and their configuration."""

from runners.config import TrainConfig
from runners.result import TrialResult

__all__ = ["TrainConfig", "TrialResult"]
