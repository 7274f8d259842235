"""The one interface every search space implements; the study and the CLI depend on exactly this."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nas.arch import ArchConfig
from nas.errors import UsageError

if TYPE_CHECKING:  # optuna is only needed for the trial's type
    from optuna.trial import BaseTrial


@dataclass(frozen=True)
class Rule:
    """A design rule: one named covariate of a shape, read across all of a study's runs by the rule model
    (``nas.stats.rules``: loss = x'beta + a deviation per shape + seed effects + noise), so that a study too noisy to
    rank single shapes can still say what a *kind* of change does (Radosavovic et al., "On network design spaces
    for visual recognition", ICCV 2019, read such rules from populations of models by hand).

    ``covariate(shape, baseline)`` is the shape's value (the model has its own intercept: any origin will do);
    ``change`` and ``per_change`` are how an answer says it: the effect of ``per_change`` units, e.g.
    ``"halving the first layer's heads"`` and ``-1`` for a log2 covariate."""

    name: str
    unit: str  # one unit of the covariate, as a table heads its column: "layer", "doubling of h_1"
    meaning: str  # one sentence: what the covariate measures
    change: str  # the change the answer's sentence states: "halving the first layer's heads"
    per_change: float  # that change in units of the covariate
    covariate: Callable[[ArchConfig, ArchConfig], float]  # (shape, baseline) -> value
    default: bool = True  # in the space's default catalog; False: offered with --rules only
    square_of: str | None = None  # this rule is that rule's covariate squared: the pair is a U with an optimum
    value_text: Callable[[float], str] | None = None  # a covariate value in the user's words ("d_model/L = 32")

    def value(self, shape: ArchConfig, baseline: ArchConfig) -> float:
        return float(self.covariate(shape, baseline))


class SearchSpace(ABC):
    """A finite set of ``ArchConfig`` members with a distinguished baseline.

    Contract shared by all spaces:

    - ``baseline()`` is a member and the first one ``__iter__`` yields;
    - ``__iter__`` yields every member exactly once, in a deterministic order, streaming;
    - ``count()`` is exact and equals the number of members ``__iter__`` yields;
    - ``suggest(trial)`` always returns a member, and within one space instance each
      parameter name always has the same distribution (name and range);
    - ``params_of`` inverts ``suggest``: ``suggest(FixedTrial(params_of(m))) == m`` for every member ``m``.
    """

    name: str

    @abstractmethod
    def baseline(self) -> ArchConfig:
        """Uniform heads / conventional FFN: the shape every gain is measured against."""

    @abstractmethod
    def __iter__(self) -> Iterator[ArchConfig]:
        """Every member once, deterministic order, baseline first."""

    @abstractmethod
    def count(self) -> int:
        """The exact number of members."""

    @abstractmethod
    def validate(self, arch: ArchConfig) -> list[str]:
        """Every reason ``arch`` is not a member, in words; empty when it is one."""

    def contains(self, arch: ArchConfig) -> bool:
        return not self.validate(arch)

    def __contains__(self, arch: object) -> bool:
        return isinstance(arch, ArchConfig) and self.contains(arch)

    @abstractmethod
    def suggest(self, trial: BaseTrial) -> ArchConfig:
        """Sample a member through Optuna's define-by-run API."""

    @abstractmethod
    def params_of(self, arch: ArchConfig) -> dict[str, Any]:
        """The Optuna params for which ``suggest`` returns ``arch`` (for ``enqueue_trial``)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The space's options, JSON-serialisable (stored with the study, printed by the CLI)."""

    @abstractmethod
    def row(self, arch: ArchConfig) -> dict[str, Any]:
        """One flat description of a member for tables, JSON/CSV listings and reports."""

    table_columns: tuple[str, ...] = ()  # the subset of ``row`` keys that ``nas space list`` shows as a table
    rules: tuple[Rule, ...] = ()  # the design rules a study of this space is read by (``Rule``), opt-in ones too

    def _require_member(self, arch: ArchConfig) -> None:
        reasons = self.validate(arch)
        if reasons:
            raise UsageError(f"not a member of the {self.name} space: {'; '.join(reasons)}")


# ----------------------------------------------------------------- shared checks (one-line UsageErrors)
def heads_error(heads: int, d_model: int) -> str | None:
    """Why ``heads`` cannot split ``d_model`` evenly, listing the valid head counts nearby; None when it can."""
    if heads >= 1 and d_model % heads == 0:
        return None
    bound = min(d_model, max(2 * heads, 12))  # the head counts near the one given
    valid = [h for h in range(1, bound + 1) if d_model % h == 0]
    listed = f"divisors ≤ {valid[-1]} are {','.join(map(str, valid))}" if len(valid) > 1 else \
        f"its only divisor up to {bound} is 1"  # "divisors ≤ 1 are 1" for a prime width
    if heads < 1:  # "0 does not divide" is true of every width and says nothing
        return f"{heads} heads is not a head count: give at least 1 (d_model={d_model}: {listed})"
    return f"{heads} does not divide d_model={d_model}; {listed}"


def check_heads(heads: int, d_model: int) -> None:
    reason = heads_error(heads, d_model)
    if reason:
        raise UsageError(reason)


def check_positive(name: str, value: int, what: str = "it must be a positive integer",
                   maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{name}={value!r} is invalid: {what}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{name}={value:,} is too large: at most {maximum:,}")
