"""What a study *is*: the training setup it runs, its identity, and its default name.

Two ``nas search`` commands with the same identity (space, training, data, objectives) continue
one study; a command whose identity differs from a stored study's is refused rather than
mixing results. Run-only options (``--threads``, ``--device``, ``--compile``) are how a trial
runs, not what it computes, so they are not part of the identity.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import optuna

from nas.data import TokenData
from nas.errors import UsageError
from nas.study.config import SearchConfig, display_url
from runners import cores
from runners.config import TrainConfig
from runners.presets import get_preset
from search_spaces.base import SearchSpace
from search_spaces.factory import SpaceOptions, build_space


def train_config(config: SearchConfig) -> TrainConfig:
    """The preset's ``TrainConfig`` with the command line's overrides (and threads split among local workers)."""
    train = get_preset(config.preset).train
    overrides = dict(config.train_overrides)
    if isinstance(config.workers, int) and config.workers > 1 and not overrides.get("threads"):
        overrides["threads"] = max(1, cores.available_cores() // config.workers)
    return train.with_(**overrides) if overrides else train


def identity(config: SearchConfig, space: SearchSpace, train: TrainConfig, data: TokenData) -> dict[str, Any]:
    """What defines a study: two commands with the same identity continue one study."""
    train_part = train.result_fields()  # how a trial runs (threads, device...) is not what it computes
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


def differences(stored: Any, given: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted path, stored value, given value)`` of every leaf where two identities differ."""
    if isinstance(stored, dict) and isinstance(given, dict):
        found = []
        for key in sorted(set(stored) | set(given), key=str):
            found += differences(stored.get(key, "(absent)"), given.get(key, "(absent)"),
                                 f"{path}.{key}" if path else str(key))
        return found
    return [] if stored == given else [(path or "identity", stored, given)]


def other_data_note(storage: optuna.storages.BaseStorage, ident: dict[str, Any], name: str) -> list[str]:
    """A new default-named study beside one with the same options on other data (the data file changed, or another
    was given): the same command then starts afresh, since the default name hashes the data, and said nothing.
    Where several such studies are stored (the file changed more than once), the note names the newest one, the
    study this command resumed until the data changed, and counts the others."""
    matching = [summary for summary in optuna.get_all_study_summaries(storage, include_best_trial=False)
                if summary.study_name != name and isinstance(stored := summary.user_attrs.get("nas:identity"), dict)
                and [path for path, _, _ in differences(stored, ident)] == ["data"]]
    if not matching:
        return []
    newest = max(matching, key=lambda summary: storage.get_study_id_from_name(summary.study_name))  # ids grow
    made_on = newest.user_attrs.get("nas:data", "other data")
    older = len(matching) - 1
    others = f" ({older} older stud{'ies' if older > 1 else 'y'} there on other data too)" if older else ""
    return [f"a new study {name!r}: the storage's {newest.study_name!r} has the same options on other data "
            f"(--data {made_on!r}, or that file before it changed); give that data to resume it{others}"]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def check_identity(study: optuna.Study, ident: dict[str, Any], config: SearchConfig) -> None:
    """``UsageError`` unless the stored study was made with this identity, naming what differs and its stored value.

    A study without an identity that ``nas.study.session.unfilled`` does not recognise (trials or attributes of
    another tool) was not made by ``nas search`` and is refused at once."""
    stored = study.user_attrs.get("nas:identity")
    if stored is None:
        raise UsageError(f"study {config.study_name!r} exists but was not made by nas search; "
                         "choose another --study-name")
    if stored != ident:
        found = differences(stored, ident)
        shown = "; ".join(f"{path} is {_short(old)} there, {_short(new)} here" for path, old, new in found[:3])
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        made_on = study.user_attrs.get("nas:data")  # the data is compared by its fingerprint: name what it was
        if isinstance(made_on, str) and any(path.split(".")[0] == "data" for path, _, _ in found):
            more += f" (the study was made on --data {made_on!r}; a file that changed since has another fingerprint)"
        raise UsageError(f"study {config.study_name!r} in {display_url(config.storage)} was created with other "
                         f"settings: {shown}{more}; re-run with those or choose a new --study-name")
