"""What a study *is*: the training setup it runs, its identity, and its default name.

Two ``nas search`` commands with the same identity (space, training, data, objectives) continue
one study; a command whose identity differs from a stored study's is refused rather than
mixing results. Run-only options (``--threads``, ``--device``, ``--compile``) are how a trial
runs, not what it computes, so they are not part of the identity.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import optuna

from nas.data import TokenData
from nas.errors import UsageError
from nas.study.config import SearchConfig
from runners.config import TrainConfig
from runners.device import available_cores
from runners.presets import get_preset
from search_spaces.base import SearchSpace
from search_spaces.factory import SpaceOptions

POLL_S = 0.5  # how often a worker looks again for the identity another worker is writing

# how a trial runs, not what it computes: a study can be resumed (or shared) with other values
RUN_ONLY_FIELDS = ("threads", "device", "compile")


def train_config(config: SearchConfig) -> TrainConfig:
    """The preset's ``TrainConfig`` with the command line's overrides (and threads split among local workers)."""
    train = get_preset(config.preset).train
    overrides = dict(config.train_overrides)
    if config.workers > 1 and not overrides.get("threads"):
        overrides["threads"] = max(1, available_cores() // config.workers)
    return train.with_(**overrides) if overrides else train


def identity(config: SearchConfig, space: SearchSpace, train: TrainConfig, data: TokenData) -> dict[str, Any]:
    """What defines a study: two commands with the same identity continue one study."""
    train_part = {k: v for k, v in train.to_dict().items() if k not in RUN_ONLY_FIELDS}
    ident = {"space": space.describe(), "train": train_part, "data": data.fingerprint,
             "objectives": list(config.objectives)}
    return json.loads(json.dumps(ident, sort_keys=True, default=str))


def default_study_name(config: SearchConfig, ident: dict[str, Any]) -> str:
    """``<space>-<preset>``, plus a short hash when shape, training or data differ from the preset's defaults.

    Run-only options (``--threads``, ``--device``, ``--compile``) and overrides equal to the preset's
    value keep the plain name, so the same study resumes whatever machine or thread count runs it.
    """
    default = SearchConfig(space=SpaceOptions(space=config.space.space), preset=config.preset,
                           objectives=config.objectives)
    name = f"{config.space.space}-{config.preset}"
    preset_train = get_preset(config.preset).train.to_dict()
    changed_training = any(k not in RUN_ONLY_FIELDS and preset_train[k] != v for k, v in config.train_overrides)
    if config.space != default.space or changed_training or config.data != "builtin" \
            or config.objectives != ("loss",):
        digest = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:6]
        name += f"-{digest}"
    return name


def check_identity(study: optuna.Study, ident: dict[str, Any], config: SearchConfig) -> None:
    """``UsageError`` unless the stored study was made with this identity (waits while another worker writes it)."""
    deadline = time.monotonic() + 60
    while "nas:identity" not in study.user_attrs:  # another worker is creating it right now
        if time.monotonic() > deadline:
            raise UsageError(f"study {config.study_name!r} exists but was not made by nas search; "
                             "choose another --study-name")
        time.sleep(POLL_S)
    stored = study.user_attrs["nas:identity"]
    if stored != ident:
        differ = sorted(k for k in set(stored) | set(ident) if stored.get(k) != ident.get(k))
        raise UsageError(f"study {config.study_name!r} in {config.storage} was created with other "
                         f"{', '.join(differ)} settings; re-run with those or choose a new --study-name")
