"""Writing re-runs back to the study's storage, where ``nas report`` finds them (``reports.reruns``).

Each target preset's runs live in a study of their own beside the proxy study, named by
``nas.study.records.rerun_study_name`` and marked ``nas:rerun_of``; one trial per finished run,
COMPLETE with its validation loss (or FAIL with its status when it diverged), its user attrs
linking it to the proxy (``proxy_key``, ``proxy_rank``, ``proxy_trials``) and carrying the run's
curves, tokens/s and MFU. A (shape, seed) already recorded is not recorded again.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from nas.rerun.plan import PlannedRun, RerunSettings
from nas.study.records import RERUN_MARK, rerun_study_name


def rerun_study(storage: optuna.storages.BaseStorage, settings: RerunSettings, variant: str,
                attrs: dict[str, Any], plain: bool = True) -> optuna.Study:
    """The study of the re-runs made with ``settings``: ``rerun_study_name(proxy, preset)`` for the first settings
    used at a preset, the same name and ``:<digest>`` for others (``--tokens 8k`` beside the preset's own), so
    runs of other settings are never mixed or mistaken for one another. The report names the first by its preset
    and the others by the preset and ``variant`` (``nas:rerun_label``: what tells them apart, e.g. the tokens); the
    first too unless ``plain`` (the preset's own tokens and data)."""
    base = rerun_study_name(settings.proxy_study, settings.preset)
    existing = {s.study_name: s.user_attrs for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    first = existing.get(base)
    name = base if first is None or first.get("nas:run_settings") in (None, settings.digest) else \
        f"{base}:{settings.digest}"
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)
    if study.user_attrs.get("nas:run_settings") is None:
        study.set_user_attr(RERUN_MARK, settings.proxy_study)
        study.set_user_attr("nas:preset", settings.preset)
        # the preset's name alone only for its own settings: `--tokens 8k` at tiny was labelled "tiny", which a
        # reader takes for tiny's 4,096 tokens
        label = settings.preset if name == base and plain else \
            f"{settings.preset} ({variant}" + (")" if name == base else f", settings {settings.digest[:6]})")
        study.set_user_attr("nas:rerun_label", label)
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        study.set_user_attr("nas:run_settings", settings.digest)
    return study


def recorded(study: optuna.Study, settings: RerunSettings) -> set[tuple[str, int]]:
    """(proxy key, seed) of the runs already in the study, made with ``settings`` (a study made before runs carried
    their settings counts none: its runs are re-checked against their folders, which are keyed by them)."""
    return {(t.user_attrs["proxy_key"], int(t.user_attrs["seed"])) for t in study.get_trials(deepcopy=False)
            if "proxy_key" in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.FAIL)
            and t.user_attrs.get("run_settings") == settings.digest}


def record(study: optuna.Study, run: PlannedRun, result: dict[str, Any], proxy_trials: list[int],
           settings: RerunSettings) -> None:
    ok = result.get("status") == "ok" and result.get("val_loss") is not None
    attrs = {"run_settings": settings.digest, "proxy_key": run.shape.proxy_key, "proxy_rank": run.shape.proxy_rank,
             "proxy_trials": proxy_trials,
             "key": run.target.key(), "arch": run.target.to_dict(), "role": run.shape.role, "seed": run.seed,
             "transfer": list(run.shape.transfer.rules), "run_dir": str(run.folder)}
    for name in ("status", "reason", "val_loss", "eval_curve", "train_curve", "tokens_seen", "tokens_per_s", "mfu",
                 "peak_flops", "world_size", "wall_time_s", "flops_per_token"):
        attrs[name] = result.get(name)
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE if ok else TrialState.FAIL,
                                              value=result["val_loss"] if ok else None, user_attrs=attrs))
