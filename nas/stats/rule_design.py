"""Which shapes a rule check trains at a longer budget: a small sample that spans the rules, chosen by design.

``nas rules --confirm`` re-fits the rules at a longer budget on a few shapes: the baseline and ``n`` others. Where
the rules' estimates come from is the spread of the covariates across shapes, so the sample is a D-optimal design
for the rules' effects (Kiefer and Wolfowitz 1959; Atkinson and Donev, "Optimum experimental designs", 1992): the
shapes whose rows ``x = (1, z_1, ..., z_R)`` (each covariate standardised over the candidates) maximise
``det(X'X)``, chosen greedily and improved by Fedorov's exchange. Each distinct covariate vector is a candidate once
(its best-measured shape: the most proxy seeds, then the board's rank), so the sample spreads over the values the
study has (balanced across the levels of a discrete rule, both ends and the middle of a continuous one) before it
repeats one, which a linear rule's check needs (its line, not only its ends).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

RIDGE = 1e-6  # keeps det(X'X) positive while the sample is smaller than the model


def _log_det(rows: np.ndarray) -> float:
    sign, value = np.linalg.slogdet(rows.T @ rows + RIDGE * np.eye(rows.shape[1]))
    return float(value) if sign > 0 else -np.inf


def design_sample(covariates: Mapping[str, Sequence[float]], baseline: str, n: int, order: Sequence[str],
                  seeds: Mapping[str, int] | None = None) -> list[str]:
    """The baseline and up to ``n`` other shapes of ``covariates`` (module docstring); ``order``: the board's, best
    first (between shapes of one covariate vector, the one with more ``seeds``, then the better rank)."""
    rank = {key: i for i, key in enumerate(order)}
    counts = seeds or {}
    keys = [baseline, *sorted((k for k in covariates if k != baseline),
                              key=lambda k: (-counts.get(k, 0), rank.get(k, len(rank)), k))]
    vectors = [tuple(round(float(v), 9) for v in covariates[k]) for k in keys]
    values = np.array([covariates[k] for k in keys], dtype=float)  # (C, R): row 0 the baseline
    spread = values.std(axis=0)
    rows = np.hstack([np.ones((len(keys), 1)), (values - values.mean(axis=0)) / np.where(spread > 0, spread, 1.0)])

    def distinct(chosen: list[int]) -> int:
        return len({vectors[i] for i in [0, *chosen]})

    def score(chosen: list[int]) -> tuple[int, float]:  # new covariate vectors first, then det(X'X)
        return distinct(chosen), _log_det(rows[[0, *chosen]])

    chosen: list[int] = []
    while len(chosen) < min(n, len(keys) - 1):
        chosen.append(max((i for i in range(1, len(keys)) if i not in chosen),
                          key=lambda i: (score([*chosen, i]), -i)))
    for _ in range(len(chosen)):  # Fedorov's exchange: swap a chosen shape for another while the score grows
        improved = False
        for position in range(len(chosen)):
            for i in range(1, len(keys)):
                trial = [*chosen[:position], i, *chosen[position + 1:]]
                if i not in chosen and score(trial) > score(chosen):
                    chosen, improved = trial, True
        if not improved:
            break
    return [baseline, *sorted((keys[i] for i in chosen), key=lambda k: rank.get(k, len(rank)))]
