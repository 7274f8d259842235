"""Which design rules a study is read by: its space's catalog (declared beside each space), and ``--rules`` choices.

A stored study names its space (``prism``, ``hourglass``, ``joint``) and shows, by its shapes, whether it searched
grouped key/value heads; its catalog is that space's rules (``search_spaces.base.Rule``), the grouped-query rule
added for a grouped study. The default rules are read unless ``--rules a,b`` names others of the catalog (the
opt-in ones included). Imports no torch.
"""

from __future__ import annotations

from nas.errors import UsageError
from search_spaces.base import Rule
from search_spaces.hourglass_rules import HOURGLASS_RULES
from search_spaces.kv import GQA_RULES
from search_spaces.prism import PRISM_RULES

CATALOGS: dict[str, tuple[Rule, ...]] = {
    "prism": PRISM_RULES,
    "hourglass": HOURGLASS_RULES,
    "joint": PRISM_RULES + HOURGLASS_RULES,
}


def rule_catalog(space: str, grouped: bool = False) -> tuple[Rule, ...]:
    """Every rule a study of ``space`` may be read by (opt-in ones too); () for a space with no catalog."""
    return CATALOGS.get(space, ()) + (GQA_RULES if grouped else ())


def choose_rules(catalog: tuple[Rule, ...], names: str | None) -> tuple[Rule, ...]:
    """The catalog's default rules, or the ones ``names`` lists (``"a,b"``, in that order); ``UsageError`` naming an
    unknown rule and every valid one."""
    if names is None:
        return tuple(rule for rule in catalog if rule.default)
    by_name = {rule.name: rule for rule in catalog}
    chosen: list[Rule] = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in by_name:
            valid = ", ".join(by_name) or "none (this study's space declares no rules)"
            raise UsageError(f"--rules: unknown rule {name!r}; this study's rules are {valid}")
        if by_name[name] not in chosen:
            chosen.append(by_name[name])
    if not chosen:
        raise UsageError(f"--rules {names!r} names no rule; this study's rules are {', '.join(by_name)}")
    for rule in chosen:  # a curvature without its slope is no U: both, or the slope alone
        if rule.square_of and by_name[rule.square_of] not in chosen:
            raise UsageError(f"--rules: {rule.name} is the square of {rule.square_of}; give both "
                             f"({rule.square_of},{rule.name}) or {rule.square_of} alone")
    return tuple(chosen)
