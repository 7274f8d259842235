"""One trial: draw (or read the queued) shape, answer it from an earlier trial or train it, and tell Optuna.

No shape is trained twice with the same seed: a trial whose (shape, seed) was already
trained is answered from the stored result and marked ``duplicate_of`` (it does not count);
one that is being trained by a lower-numbered trial waits for it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from nas.arch import ArchConfig
from nas.study.heartbeat import Heartbeat, TrialLost
from nas.study.planning import Plan
from nas.study.records import counts, in_flight, is_duplicate, key_seed, loss_of, shape_attrs
from nas.study.recovery import fail_abandoned, fail_stale
from nas.study.session import Search, make_sampler
from nas.study.storage import write_user_attrs
from runners.result import TrialResult

if TYPE_CHECKING:
    from nas.data import TokenData
    from runners.config import TrainConfig
    from runners.proxy import ReportFn

POLL_S = 0.5  # how often a waiting worker looks at the storage again
MAX_DUPLICATE_STREAK = 10  # after this many duplicates in a row, one random proposal breaks the loop
UNPRUNED_ROLES = ("baseline", "replicate", "race", "confirm", "adaptive", "adaptive-confirm")  # compared on full runs


def set_attrs(search: Search, trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """All of ``attrs`` in one storage transaction (see ``nas.study.storage.write_user_attrs``)."""
    write_user_attrs(search.storage, trial, attrs)


def result_attrs(result: TrialResult) -> dict[str, Any]:
    """A ``TrialResult`` as user attrs: the parameter breakdown as ``params_breakdown``, NaN/inf as null (JSON)."""
    data = result.to_dict()
    data["params_breakdown"] = data.pop("params")
    for name in ("val_loss", "val_ppl"):
        if not math.isfinite(data[name]):
            data[name] = None  # JSON has no NaN/inf
    data["eval_curve"] = [[t, v if math.isfinite(v) else None] for t, v in data["eval_curve"]]
    data["train_curve"] = [[t, v if math.isfinite(v) else None] for t, v in data["train_curve"]]
    return data


def find_original(search: Search, key: str, seed: int, number: int, heartbeat: Heartbeat,
                  known: list[FrozenTrial] | None = None) -> FrozenTrial | None:
    """An earlier trial of the same (shape, seed) that counts; waits while a lower-numbered one may still train it.

    The lowest-numbered trial of a (shape, seed) trains it and the others wait for its result. A lower-numbered
    trial that has no shape yet (just handed out by ``ask`` to another worker) may be about to take this one,
    so it is waited for too: every trial records its shape before it gets here, so the wait is short.

    ``known``, the study as read just before this trial's ``ask``, answers without a new read when it is
    final below ``number``: it holds every lower-numbered trial (``number == len(known)``) and none of them
    was running or queued, so none can still change or take this shape (the usual case with one worker). A
    queued trial is not final: another worker may pop it and plan this very shape and seed into it.
    """
    final_below = known is not None and number == len(known) and not any(
        in_flight(t) or t.state == TrialState.WAITING for t in known)
    while True:
        trials = known if final_below else search.study.get_trials(deepcopy=False)
        same = [t for t in trials if t.number != number and key_seed(t) == (key, seed) and not is_duplicate(t)]
        done = [t for t in same if counts(t)]
        if done:
            return min(done, key=lambda t: t.number)
        if not any(in_flight(t) and t.number < number and key_seed(t) in (None, (key, seed)) for t in trials):
            return None
        heartbeat.check()  # waiting, too, ends when another worker has taken this trial
        fail_stale(search.study, search.storage, search.study_id)
        fail_abandoned(search.study, search.storage, search.study_id)
        time.sleep(POLL_S)


def objective_values(search: Search, arch: ArchConfig, loss: float, tokens_per_s: float) -> list[float]:
    pick = {"loss": loss, "params": float(arch.n_params()["total"]), "tokens_per_s": tokens_per_s,
            "kv_cache": float(arch.kv_cache_bytes_per_token())}
    return [pick[o] for o in search.config.objectives]


def answer_duplicate(search: Search, trial: optuna.Trial, original: FrozenTrial) -> str:
    copied = {name: original.user_attrs[name] for name in ("val_loss", "status", "reason", "tokens_per_s")
              if name in original.user_attrs}
    set_attrs(search, trial, {"duplicate_of": original.number, **copied})
    if original.state == TrialState.COMPLETE:
        search.study.tell(trial, original.values)
    elif original.state == TrialState.PRUNED:
        if original.intermediate_values and not search.multi_objective:
            step = max(original.intermediate_values)
            trial.report(original.intermediate_values[step], step)
        search.study.tell(trial, state=TrialState.PRUNED)
    else:
        search.study.tell(trial, state=TrialState.FAIL)
    return "duplicate"


def run_proxy(arch: ArchConfig, train: TrainConfig, data: TokenData, report: ReportFn) -> TrialResult:
    """``runners.proxy.run``, imported at a worker's first trial: the module brings torch and the model, which a
    search's parent (it trains nothing when its workers do) never needs."""
    from runners.proxy import run

    return run(arch, train, data, report)


def train(search: Search, trial: optuna.Trial, arch: ArchConfig, seed: int, role: str,
          heartbeat: Heartbeat) -> tuple[str, float | None]:
    """Train the shape, record its result and tell Optuna; ``TrialLost`` if another worker took the trial meanwhile."""
    may_prune = not search.multi_objective and role not in UNPRUNED_ROLES
    final_tokens = search.train.steps * search.train.tokens_per_step  # the last report: the run has ended

    def report(tokens: int, loss: float) -> bool:
        heartbeat.check()  # stop training a trial whose retry another worker now trains
        if search.multi_objective:
            return False
        trial.report(loss, step=tokens)
        return may_prune and tokens < final_tokens and trial.should_prune()

    try:
        result = run_proxy(arch, search.train.with_(seed=seed), search.data, report)
        heartbeat.check()  # nor record its result: the trial is finished once, by its retry
        set_attrs(search, trial, result_attrs(result))
    except optuna.exceptions.UpdateFinishedTrialError:  # the storage said it first: the trial was failed meanwhile
        raise TrialLost(heartbeat.lost_reason()) from None
    if result.status == "ok":
        values = objective_values(search, arch, result.val_loss, result.tokens_per_s)
        search.study.tell(trial, values)
        return "complete", result.val_loss
    if result.status == "pruned":
        search.study.tell(trial, state=TrialState.PRUNED)
        return "pruned", result.val_loss
    search.study.tell(trial, state=TrialState.FAIL)
    return result.status, None


@contextmanager
def drawing_with(study: optuna.Study, sampler: optuna.samplers.BaseSampler | None) -> Iterator[None]:
    """Let ``sampler`` draw the trial's params: Optuna samples lazily, at each ``suggest_*`` call, not at ``ask``."""
    if sampler is None:
        yield
        return
    own, study.sampler = study.sampler, sampler
    try:
        yield
    finally:
        study.sampler = own


def proposal_seed(seed: int, number: int) -> int:
    """The seed trial ``number`` draws its shape with: distinct per trial, so per process and machine.

    Trial numbers are unique within a study whichever process or machine asks, so workers
    sharing a study never draw in lockstep, and one worker with ``--seed`` draws the same
    proposals each time it runs the same study.
    """
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def proposal_sampler(search: Search, number: int, plan: Plan | None,
                     duplicate_streak: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler that draws trial ``number``'s shape.

    A plan fixes every parameter (a random base sampler is never asked, and unlike TPE it does not
    read the study to infer a search space it would not use); after ``MAX_DUPLICATE_STREAK``
    duplicates in a row, a random draw breaks the loop; otherwise the study's sampler kind
    (TPE by default), seeded by ``proposal_seed``. Samplers keep their history in the storage,
    so a fresh one per trial proposes what a long-lived one would, from a seed of its own.
    """
    seed = proposal_seed(search.train.seed, number)
    if plan is not None:
        return optuna.samplers.PartialFixedSampler(plan.params, optuna.samplers.RandomSampler(seed=seed))
    if duplicate_streak >= MAX_DUPLICATE_STREAK:
        return optuna.samplers.RandomSampler(seed=seed)
    return make_sampler(search.config, seed)


def run_trial(search: Search, trial: optuna.Trial, heartbeat: Heartbeat, plan: Plan | None = None,
              duplicate_streak: int = 0,
              known: list[FrozenTrial] | None = None) -> tuple[str, ArchConfig, int, str, float | None]:
    """Suggest (or read the enqueued) shape, de-duplicate, train, tell. Returns (state, arch, seed, role, loss).

    ``plan`` applies unless ``ask`` handed out a queued trial (which carries its own shape and seed);
    ``proposal_sampler`` draws the shape; ``known`` is the study as read before ``ask`` (see
    ``find_original``).
    """
    given = dict(trial.user_attrs)  # a queued trial's own key, seed and role; else the plan's, if any
    if plan is not None and "key" not in given:
        given.update(plan.user_attrs)
    with drawing_with(search.study, proposal_sampler(search, trial.number, plan, duplicate_streak)):
        arch = search.space.suggest(trial)
    seed = int(given.get("seed", search.train.seed))
    role = given.get("role", "sampled")
    # one transaction (key, seed, role, shape): from now on other workers see what this trial trains; until
    # then a worker that draws the same shape waits for this lower-numbered, shapeless trial (find_original)
    set_attrs(search, trial, {**shape_attrs(arch, seed, role), "placed_on": search.device_label,
                              "worker": search.worker})
    original = find_original(search, arch.key(), seed, trial.number, heartbeat, known)
    if original is not None:
        return answer_duplicate(search, trial, original), arch, seed, role, loss_of(original)
    state, loss = train(search, trial, arch, seed, role, heartbeat)
    return state, arch, seed, role, loss
