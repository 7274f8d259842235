"""What ``nas search`` was asked for (``SearchConfig``), checked without importing torch.

Kept apart from the rest of ``nas.study`` so that a mistyped option is reported at once: the
worker modules load torch (about 4 s), and a usage error should not wait for it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from nas.errors import UNPRINTABLE, UsageError, quoted
from runners.presets import DEFAULT_PRESET, get_preset
from search_spaces.factory import SpaceOptions, build_space

DEFAULT_STORAGE = "sqlite:///nas.db"  # SQLite in the working directory: embedded, readable by optuna-dashboard
_PASSWORD = re.compile(r"(://[^:/@\s]*:)([^@/\s]*)(@)")  # scheme://user:PASSWORD@host


def display_url(url: str) -> str:
    """A storage URL safe to print, log or write down: its password replaced by ``***``."""
    return _PASSWORD.sub(r"\1***\3", str(url))


def hidden_password_note(url: str) -> str:
    """`` (*** stands for ...)`` after a command shown with ``display_url(url)`` where that hid a password: the command
    as printed would not log in; else nothing."""
    return " (*** stands for the storage's password, not printed)" if display_url(url) != str(url) else ""


def check_study_name(name: str, flag: str = "--study-name") -> str:
    """A study name is 1-512 printable characters of valid text: no control character (a terminal escape), no
    format mark or line break, no byte that was not UTF-8; ``UsageError`` naming the first bad character."""
    if not name.strip() or len(name) > 512:
        raise UsageError(f"{flag} {quoted(name[:40])} is invalid: give 1-512 printable characters")
    for i, char in enumerate(name):
        if unicodedata.category(char) in UNPRINTABLE:
            what = "a byte that is not UTF-8" if unicodedata.category(char) == "Cs" else f"U+{ord(char):04X}"
            raise UsageError(f"{flag} {quoted(name[:40])} is invalid: character {i + 1} is {what}, which does not "
                             "print; give 1-512 printable characters")
    return name


SAMPLERS = ("tpe", "random", "grid", "gp", "nsga2")
REPLICATES = ("race", "fixed", "adaptive", "adaptive-answer")
MAX_ALLOCATION_SIZE = 10_000  # --race-size, --replicate-top
PRUNERS = ("auto", "median", "hyperband", "none")
# kv_cache: KV-cache bytes per token of context (ArchConfig.kv_cache_bytes_per_token), with a space's GQA options
OBJECTIVES = {"loss": "minimize", "params": "minimize", "tokens_per_s": "maximize", "kv_cache": "minimize"}


@dataclass(frozen=True)
class SearchConfig:
    """Everything ``nas search`` was asked for."""

    space: SpaceOptions = field(default_factory=SpaceOptions)
    preset: str = DEFAULT_PRESET
    train_overrides: tuple[tuple[str, Any], ...] = ()  # (TrainConfig field, value) given on the command line
    data: str = "builtin"
    storage: str = DEFAULT_STORAGE
    study_name: str | None = None
    trials: int = 200
    sampler: str | None = None  # None: tpe (single objective) or nsga2 (several)
    # auto: none on an exhaustive walk (its early pruning points rank members poorly: benchmarks figure 11),
    # median when a sampler proposes
    pruner: str = "auto"
    objectives: tuple[str, ...] = ("loss",)
    workers: int | str = 1  # a count, or "auto" (nas.study.placement.resolve_workers)
    # after an exhaustive walk: adaptive (the knowledge gradient, nas.study.adaptive), race (racing replicates)
    # or fixed (replicate_top's seeds); figure 10 compares them
    replicates: str = "adaptive"
    race_size: int = 8  # race: the first pass's best shapes that race the baseline
    replicate_top: int = 4  # fixed: shapes besides the baseline that get seed replicates after an exhaustive walk
    heartbeat_interval: int = 10
    cache_dir: str | None = None

    def validate(self) -> None:
        if isinstance(self.workers, str) and self.workers != "auto":
            raise UsageError(f"--workers {self.workers!r} is invalid: give a number of workers (1-256) or auto")
        bounds = (("--trials", self.trials, 10**7), ("--workers", 1 if self.workers == "auto" else self.workers, 256),
                  ("--heartbeat", self.heartbeat_interval, 86_400),
                  ("--race-size", self.race_size, MAX_ALLOCATION_SIZE),
                  ("--replicate-top", self.replicate_top, MAX_ALLOCATION_SIZE))
        for flag, value, maximum in bounds:
            if value < 1:
                raise UsageError(f"{flag} {value} is invalid: give at least 1")
            if value > maximum:
                raise UsageError(f"{flag} {value:,} is too large: at most {maximum:,}")
        if self.study_name is not None:
            check_study_name(self.study_name)
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise UsageError(f"unknown sampler {self.sampler!r}; choose {', '.join(SAMPLERS)}")
        if self.pruner not in PRUNERS:
            raise UsageError(f"unknown pruner {self.pruner!r}; choose {', '.join(PRUNERS)}")
        bad = [o for o in self.objectives if o not in OBJECTIVES]
        repeated = len(set(self.objectives)) != len(self.objectives)
        if bad or not self.objectives or repeated or self.objectives[0] != "loss":
            raise UsageError(f"--objectives {','.join(self.objectives)!r} is invalid: use loss, loss,params, "
                             "loss,tokens_per_s or loss,kv_cache")
        if self.sampler == "gp" and len(self.objectives) > 1:
            raise UsageError("--sampler gp takes a single objective; use nsga2 or tpe for several")
        if self.replicates not in REPLICATES:
            raise UsageError(f"unknown replicates policy {self.replicates!r}; choose {', '.join(REPLICATES)}")


def precheck(config: SearchConfig) -> None:
    """Every check that needs neither torch nor the data: options, preset, training overrides, the space.

    With the builtin data (byte-level, vocabulary 256) the space is built as the search will build it;
    other data can change the vocabulary, so their space is checked once the data is loaded.
    """
    config.validate()
    preset = get_preset(config.preset)
    train = preset.train.with_(**dict(config.train_overrides))
    if train.device not in ("auto", "cpu"):  # is that device here? (torch, but only when a device is named)
        from runners.device import resolve_device

        resolve_device(train.device)
    options = preset.space_options(config.space)
    if "kv_cache" in config.objectives and options.kv_groups is None and not options.kv_schedule:
        raise UsageError("--objectives loss,kv_cache needs a space with grouped key/value heads (--kv-groups or "
                         "--kv-schedule): without them every member has the baseline's KV cache")
    if config.data == "builtin":
        build_space(options, defaults=preset.baseline.replace(vocab_size=256))
