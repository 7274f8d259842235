"""Opening a study: load the data, build the space, create or load the Optuna study with its sampler and pruner.

``Search`` is one process's view of the study; every worker (local or on another machine)
opens its own with ``open_search``. The first one creates the study and enqueues the
baseline as trial 0, so every report can state the gain over it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace

import optuna

from nas.arch import ArchConfig
from nas.data import TokenData, check_enough_tokens, check_vocabulary, load_data
from nas.data.loading import data_holds
from nas.errors import UsageError, printable
from nas.files import show
from nas.study.config import MAX_ALLOCATION_SIZE, OBJECTIVES, REPLICATES, SAMPLERS, SearchConfig, display_url
from nas.study.identity import check_identity, identity, other_data_note, study_name, train_config
from nas.study.records import counts, unreadable_attr
from nas.study.sqlite_file import study_names
from nas.study.storage import make_storage, storage_file
from runners.config import TrainConfig
from runners.presets import get_preset
from search_spaces.base import SearchSpace
from search_spaces.factory import build_space

PRUNE_FROM = 0.5  # of a trial's tokens: no pruning before (first_pruning_point)
MEDIAN_STARTUP_TRIALS = 5  # completed trainings with a value at a step before the median pruner prunes there


@dataclass
class Search:
    """One process's view of the study: the loaded data, the space, the training setup."""

    config: SearchConfig
    study: optuna.Study
    space: SearchSpace
    train: TrainConfig
    data: TokenData
    exhaustive: bool
    storage: optuna.storages.BaseStorage  # the storage object this process opened (heartbeats and writes go here)
    study_id: int
    worker: int = 0
    notes: list[str] = field(default_factory=list)  # what the command should say besides the trials (a dead worker)
    device_label: str = "cpu"  # the machine's device this process trains on (nas.study.placement), for progress
    placements: list = field(default_factory=list)  # every local worker's Placement (the parent's view)
    _members: list[ArchConfig] | None = field(default=None, repr=False)

    @property
    def baseline(self) -> ArchConfig:
        return self.space.baseline()

    def members(self) -> list[ArchConfig]:
        """The space's members in its order (built once: the exhaustive walk reads them before every trial)."""
        if self._members is None:
            self._members = list(self.space)
        return self._members

    @property
    def multi_objective(self) -> bool:
        return len(self.config.objectives) > 1


def sampler_name(config: SearchConfig) -> str:
    """``--sampler``, or its default: TPE for one objective, NSGA-II for several."""
    return config.sampler or ("tpe" if len(config.objectives) == 1 else "nsga2")


def make_sampler(config: SearchConfig, seed: int | None) -> optuna.samplers.BaseSampler:
    name = sampler_name(config)
    if name == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True, seed=seed,
                                          n_startup_trials=10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.BruteForceSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.GPSampler(seed=seed)  # single objective only: SearchConfig.validate checks


def resolved_pruner(config: SearchConfig, exhaustive: bool) -> str:
    """``auto`` is ``none`` on an exhaustive walk, ``median`` when a sampler proposes.

    Measured on the default proxy (benchmarks figure 11, all 129 members trained to the end): the
    loss after 8k tokens ranks members with Spearman 0.18 against the final loss, after 16k 0.61,
    after 24k 0.89, and the median pruner stopped 9 of the final top 10. A walk trains each member
    once, so a wrongly pruned member never gets another chance: it is trained to the end. A sampled
    search prunes from half its tokens on (``PRUNE_FROM``).
    """
    if config.pruner != "auto":
        return config.pruner
    return "none" if exhaustive else "median"


def first_pruning_point(train: TrainConfig) -> int:
    """The first evaluation (in tokens, the steps a trial reports at) where the median pruner may stop a trial:
    the first at or after ``PRUNE_FROM`` of the trial's tokens.

    Re-derived on the default proxy's 78 runs of figure 12 (13 shapes x 6 seeds, evaluated every 4k tokens;
    ``python -m benchmarks.proxy_fidelity --from-file`` prints it): the loss at 8k tokens ranks runs with
    Spearman 0.29 against their final loss, at 16k 0.74, at 24k 0.96. Median pruning from 8k on stopped the
    final best of its seed in 3 of 6 seeds (and half the top 3); from 16k on, none of the 6 bests and 22 % of
    the top 3, saving 26 % of the training (from 24k on: 6 %, saving 12 %).
    """
    interval = max(1, train.eval_every // train.tokens_per_step) * train.tokens_per_step
    end = train.steps * train.tokens_per_step
    earliest = math.ceil(PRUNE_FROM * train.tokens / interval) * interval
    last_before_end = (end - 1) // interval * interval  # a trial evaluated before its end can be pruned there
    return min(earliest, max(interval, last_before_end))


def make_pruner(config: SearchConfig, train: TrainConfig, exhaustive: bool = False) -> optuna.pruners.BasePruner:
    pruner = resolved_pruner(config, exhaustive)
    if pruner == "none" or len(config.objectives) > 1:  # Optuna prunes single-objective studies only
        return optuna.pruners.NopPruner()
    if pruner == "median":
        # Duplicates are told COMPLETE (with the original's value, without intermediate values), so
        # n_startup_trials alone would count them; n_min_trials counts only completed trials that
        # reported at the step in question, i.e. real trainings.
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS,
                                           n_warmup_steps=first_pruning_point(train),
                                           n_min_trials=MEDIAN_STARTUP_TRIALS)
    return optuna.pruners.HyperbandPruner(min_resource=first_pruning_point(train), max_resource=train.tokens,
                                          reduction_factor=3)


def quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # our ask/tell loop runs its own heartbeat thread (nas.study.heartbeat), which Optuna cannot see
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def open_search(config: SearchConfig, worker: int = 0, create: bool = True) -> Search:
    """Load data, build the space, create or load the study (checking it was made with the same options)."""
    config.validate()
    quiet_optuna()
    preset = get_preset(config.preset)
    train = train_config(config)
    data = load_data(config.data, cache_dir=config.cache_dir)
    check_enough_tokens(data, train.batch_size, train.seq_len)  # before the storage is touched
    space = build_space(preset.space_options(config.space),
                        defaults=preset.baseline.replace(vocab_size=data.vocab_size))
    check_vocabulary(space.baseline().vocab_size, data)  # a --vocab below the data's: before the study is made
    if space.count() < 2:  # the walk, the replicates and every answer compare shapes with the baseline
        raise UsageError(f"the {space.name} space of these options holds only the baseline: no shape to compare it "
                         f"with; `nas space list --space {space.name}` with the same options says why")
    ident = identity(config, space, train, data)
    named = config.study_name is not None
    name = study_name(config, space, train, data)
    config = replace(config, study_name=name)
    exhaustive = space.count() <= config.trials  # a space no member fits (a budget no member matches) says so here
    stored_in = storage_file(config.storage)
    if create and stored_in is not None and data_holds(config.data, stored_in):
        names = study_names(stored_in) if stored_in.exists() else frozenset()
        if names is not None and name not in names:  # a study made so before is resumed; no new one is made so
            refuse_data_beside(config.data, config.storage)
    storage = make_storage(config.storage, heartbeat_interval=config.heartbeat_interval)
    directions = [OBJECTIVES[o] for o in config.objectives]
    sampler = make_sampler(config, seed=None)  # the study's own; proposals draw through trial.proposal_sampler
    pruner = make_pruner(config, train, exhaustive)
    created = False
    if create:
        try:
            study = optuna.create_study(storage=storage, study_name=name, directions=directions,
                                        sampler=sampler, pruner=pruner)
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            pass
    if not created:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    search = Search(config, study, space, train, data, exhaustive=exhaustive, storage=storage,
                    study_id=storage.get_study_id_from_name(name), worker=worker)
    if created and not named and worker == 0:
        search.notes.extend(other_data_note(storage, ident, name))
    if created or unfilled(study):
        complete_study(search, ident)
    check_identity(study, ident, config)
    keep_replicates_policy(search)
    keep_allocation_size(search)
    keep_sampler(search)
    if not created and worker == 0:
        search.notes.extend(unreadable_counted_note(study))
    return search


def refuse_data_beside(data: str, storage: str) -> None:
    """``UsageError``: a new study whose ``--data`` folder (or glob) holds its storage. ``nas search --data .`` read
    the HTML report that ``nas report -o report.html`` wrote there as text (4.7 MB of it beside a 1.2 MB corpus),
    and the changed data made the same command start another study."""
    raise UsageError(f"--data {show(data)} holds this search's storage {display_url(storage)}: the reports and exports "
                     "written beside a study would be read as training data by the next run, which would then start "
                     "a new study; give the data in a folder of its own (e.g. --data data/), or the storage outside it")


def unreadable_counted_note(study: optuna.Study) -> list[str]:
    """A note on the trained trials that count toward ``--trials`` but that no reader can read
    (``nas.study.records.unreadable_attr``: a storage edited by hand, or written by another tool): the search
    counted them silently, and ``nas best`` and ``nas report`` skip them, each with a warning."""
    trials = study.get_trials(deepcopy=False)
    found = [(t.number, problem) for t in trials if counts(t) and (problem := unreadable_attr(t, len(trials)))]
    if not found:
        return []
    number, (name, why) = found[0]
    which = f"trial #{number}" if len(found) == 1 else f"{len(found)} trials (the first, #{number})"
    return [f"{which} of study {study.study_name!r} count{'s' * (len(found) == 1)} toward --trials, but no report "
            f"can read {'it' if len(found) == 1 else 'them'}: the stored attribute {name!r} {why} (edited by hand, "
            "or written by another tool?); nas best and nas report skip "
            f"{'it' if len(found) == 1 else 'them'}"]


REPLICATES_ROLES = {"race": "race", "confirm": "race", "replicate": "fixed", "adaptive": "adaptive",
                    "adaptive-confirm": "adaptive"}


def unfilled(study: optuna.Study) -> bool:
    """A study ``nas search`` created and was stopped before describing (Ctrl-C right after the row was made): no
    identity, no attribute but ours, and no trial but the queued baseline. It is completed, never refused."""
    attrs = study.user_attrs
    return "nas:identity" not in attrs and all(key.startswith("nas:") for key in attrs) and all(
        t.state == optuna.trial.TrialState.WAITING and t.user_attrs.get("role") == "baseline"
        for t in study.get_trials(deepcopy=False))


def complete_study(search: Search, ident: dict) -> None:
    """What makes the study a shape search, in an order that a Ctrl-C anywhere leaves completable (``unfilled``):
    its attributes, the baseline queued as trial 0, and its identity last, so that a worker who sees the identity
    sees the rest. Two workers completing one interrupted study may both queue the baseline: the second is
    answered from the first's result (``nas.study.trial``)."""
    study, baseline = search.study, search.baseline
    study.set_user_attr("nas:baseline_key", baseline.key())
    study.set_user_attr("nas:preset", search.config.preset)
    study.set_user_attr("nas:data", search.data.name)
    study.set_user_attr("nas:replicates", search.config.replicates)
    if not study.get_trials(deepcopy=False):
        study.enqueue_trial(search.space.params_of(baseline), user_attrs={"key": baseline.key(),
                                                                          "seed": search.train.seed,
                                                                          "role": "baseline"})
    study.set_user_attr("nas:identity", ident)


def stored_replicates(study: optuna.Study) -> str | None:
    """The replicates policy a study was begun with: its ``nas:replicates``, else (a study made before it was
    stored, or one whose attribute was edited into no policy) the policy its replicate trials' roles show; None when
    no replicate was planned yet."""
    stored = study.user_attrs.get("nas:replicates")
    if stored in REPLICATES:
        return stored
    roles = {t.user_attrs.get("role") for t in study.get_trials(deepcopy=False)}
    found = {REPLICATES_ROLES[r] for r in roles if r in REPLICATES_ROLES}
    return found.pop() if len(found) == 1 else None


def unreadable_setting_note(search: Search, attr: str, held: object, valid: str, used: str) -> str:
    """The note for a study attribute that holds no valid setting (edited by hand, or written by another tool):
    what it holds (its repr, cut at 60 characters), what would be ``valid``, and what the search goes on with."""
    return (f"study {search.config.study_name!r} holds {attr} = {printable(repr(held)[:60])}, which is not {valid}; "
            f"it goes on with {used} and stores that")


def keep_sampler(search: Search) -> None:
    """A resumed study keeps the sampler it was searched with unless ``--sampler`` names another; either way a change
    is said. Optuna stores no sampler with a study, so ``nas:sampler`` records the one in use. Switching is legitimate
    (each proposal reads the whole study), but without a note a user who resumed with other options would not know
    which sampler proposed the trials. A stored value that names no sampler is said and replaced. A switch asked for
    on a study that already has its ``--trials`` is said and not stored: that sampler proposes nothing."""
    stored = search.study.user_attrs.get("nas:sampler")
    chosen = sampler_name(search.config)
    name = search.config.study_name
    if stored is not None and stored not in SAMPLERS:
        search.notes.append(unreadable_setting_note(search, "nas:sampler", stored,
                                                    f"a sampler ({', '.join(SAMPLERS)})", f"--sampler {chosen}"))
    elif stored is not None and stored != chosen:
        if search.config.sampler is None:  # not asked for: the study goes on as it was begun
            search.notes.append(f"study {name!r} was searched with --sampler {stored}; it continues with it "
                                f"(--sampler {chosen} switches)")
            search.config = replace(search.config, sampler=stored)
            return
        if sum(counts(t) for t in search.study.get_trials(deepcopy=False)) >= search.config.trials:
            # nothing left to train: stored, the switch made the next plain resume go on with a sampler that had
            # proposed nothing
            search.notes.append(f"study {name!r} has its {search.config.trials} trials: --sampler {chosen} "
                                f"proposes none, and the study keeps --sampler {stored}")
            return
        search.notes.append(f"study {name!r} was searched with --sampler {stored} so far; {chosen} proposes "
                            "its trials from here on")
    if stored != chosen:
        search.study.set_user_attr("nas:sampler", chosen)


def keep_replicates_policy(search: Search) -> None:
    """A study keeps the replicates policy it was begun with: a resumed search with another ``--replicates``
    continues under the stored one and says so (switching mid-study would mix two allocations' seeds). A stored
    value that names no policy is said, and the policy the study's trials show (or ``--replicates``) replaces it."""
    held = search.study.user_attrs.get("nas:replicates")
    stored = stored_replicates(search.study)
    if held is not None and held not in REPLICATES:
        search.notes.append(unreadable_setting_note(search, "nas:replicates", held,
                                                    f"a policy ({', '.join(REPLICATES)})",
                                                    f"--replicates {stored or search.config.replicates}"))
    if stored is None:
        search.study.set_user_attr("nas:replicates", search.config.replicates)
        return
    if held != stored:
        search.study.set_user_attr("nas:replicates", stored)
    if stored != search.config.replicates:
        search.notes.append(f"study {search.config.study_name!r} was begun with --replicates {stored}; it continues "
                            f"with it, not {search.config.replicates} (a new --study-name starts a study with "
                            f"{search.config.replicates})")
        search.config = replace(search.config, replicates=stored)


# the option that sizes a policy's allocation: its SearchConfig field and flag
ALLOCATION_SIZES = {"race": ("race_size", "--race-size"), "fixed": ("replicate_top", "--replicate-top")}


def keep_allocation_size(search: Search) -> None:
    """A study keeps the size its replicates policy was begun with (``--race-size`` of a race, ``--replicate-top``
    of fixed replicates), stored as ``nas:race_size`` / ``nas:replicate_top``: each planning call recomputes the
    candidates from it, so another size on resume re-planned a running race (shapes dropped from it or added with
    fewer seeds) without a word. A resumed search with another size continues with the stored one and says so; a
    study made before the size was stored records the one given now."""
    if search.config.replicates not in ALLOCATION_SIZES:
        return
    field_name, flag = ALLOCATION_SIZES[search.config.replicates]
    attr, given = f"nas:{field_name}", getattr(search.config, field_name)
    held = search.study.user_attrs.get(attr)
    if held is None:
        search.study.set_user_attr(attr, given)
    elif isinstance(held, bool) or not isinstance(held, int) or not 1 <= held <= MAX_ALLOCATION_SIZE:
        search.notes.append(unreadable_setting_note(search, attr, held, f"a whole number 1-{MAX_ALLOCATION_SIZE:,}",
                                                    f"{flag} {given}"))
        search.study.set_user_attr(attr, given)
    elif held != given:
        search.notes.append(f"study {search.config.study_name!r} was begun with {flag} {held}; it continues with it, "
                            f"not {given} (a new --study-name starts a study with {flag} {given})")
        search.config = replace(search.config, **{field_name: held})
