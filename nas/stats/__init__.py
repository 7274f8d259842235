"""The statistics of a study, as pure functions of its per-shape scores on common seeds (no storage, no torch).

- ``scores``: each shape's seeds and losses, and means put on the baseline's seeds;
- ``mixed_model`` and ``shrinkage``: the two-way random-effects model (shape level + seed effect + noise) and its
  REML fit; ``board``: the shrunk gains and the board's order read off it, which the leaderboard, the planner and
  the answer all read;
- ``comparisons``: paired gains and their intervals, the pooled paired sd, Holm's rule, the tied set, and Kendall
  tau between two rankings;
- ``resolution``: the minimum detectable gain of the answer's test and the seeds a smaller gain needs;
- ``race`` and ``adaptive``: the race's survivors, and the adaptive allocation's posterior (knowledge gradient,
  the pick, P(best), the credible tied set).

The search's policies (``nas.study``) decide from these and the readers (``reports``) show them; this package
imports neither (``tests/test_layering.py``).
"""
