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
from nas.study.config import SearchConfig, display_url
from runners.config import TrainConfig
from runners.device import available_cores
from runners.presets import get_preset
from search_spaces.base import SearchSpace
from search_spaces.factory import SpaceOptions, build_space

POLL_S = 0.5  # how often a worker looks again for the identity another worker is writing

# how a trial runs, not what it computes: a study can be resumed (or shared) with other values
RUN_ONLY_FIELDS = ("threads", "device", "compile", "micro_batch")


def train_config(config: SearchConfig) -> TrainConfig:
    """The preset's ``TrainConfig`` with the command line's overrides (and threads split among local workers)."""
    train = get_preset(config.preset).train
    overrides = dict(config.train_overrides)
    if isinstance(config.workers, int) and config.workers > 1 and not overrides.get("threads"):
        overrides["threads"] = max(1, available_cores() // config.workers)
    return train.with_(**overrides) if overrides else train


def identity(config: SearchConfig, space: SearchSpace, train: TrainConfig, data: TokenData) -> dict[str, Any]:
    """What defines a study: two commands with the same identity continue one study."""
    train_part = {k: v for k, v in train.to_dict().items() if k not in RUN_ONLY_FIELDS}
    ident = {"space": space.describe(), "train": train_part, "data": data.fingerprint,
             "objectives": list(config.objectives)}
    return json.loads(json.dumps(ident, sort_keys=True, default=str))


def default_identity(config: SearchConfig, data: TokenData) -> dict[str, Any] | None:
    """The identity ``nas search --space S --preset P`` would have with no other option; None for other data.

    Built from the resolved defaults (the preset's baseline and training setup, the space's own
    defaults), so that an option typed with its default value (``--layers 12``) changes nothing.
    """
    if config.data != "builtin":
        return None
    preset = get_preset(config.preset)
    default = SearchConfig(space=SpaceOptions(space=config.space.space), preset=config.preset, data=config.data,
                           storage=config.storage, workers=config.workers)
    space = build_space(preset.space_options(default.space),
                        defaults=preset.baseline.replace(vocab_size=data.vocab_size))
    return identity(default, space, train_config(default), data)


def default_study_name(config: SearchConfig, ident: dict[str, Any], default: dict[str, Any] | None) -> str:
    """``<space>-<preset>``, plus a short hash of the identity when it differs from the preset's default one.

    Study identity comes from the resolved values (``default_identity``), not from which options
    were typed: ``--layers 12 --heads 12`` on the ``cpu`` preset names the study ``prism-cpu``.
    Run-only options (``--threads``, ``--device``, ``--compile``) are not part of the identity,
    so the same study resumes whatever machine or thread count runs it.
    """
    name = f"{config.space.space}-{config.preset}"
    if ident != default:
        name += "-" + hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:6]
    return name


def study_name(config: SearchConfig, space: SearchSpace, train: TrainConfig, data: TokenData) -> str:
    """``--study-name`` if given, else ``default_study_name`` of this command's identity."""
    if config.study_name is not None:
        return config.study_name
    return default_study_name(config, identity(config, space, train, data), default_identity(config, data))


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
        raise UsageError(f"study {config.study_name!r} in {display_url(config.storage)} was created with other "
                         f"{', '.join(differ)} settings; re-run with those or choose a new --study-name")
