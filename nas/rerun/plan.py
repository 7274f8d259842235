"""Which runs a ``nas rerun`` makes: the proxy's top shapes and the baseline, carried to the target, times seeds.

Shapes are ranked as the leaderboard ranks them (mean proxy loss over seeds); the baseline is
always re-run, since the question is whether the proxy's *gains over it* hold. Each shape is
carried to the target preset by ``search_spaces.transfer``; one that cannot be carried is left
out with its reason (the baseline must carry). Every (shape, seed) gets its own folder under
``runs/<study>-<hash>/<preset>-<settings>/``, holding the carried shape (``arch.json``) and the run's
checkpoint, log and result, so re-running the same command finds what is done and what to resume.

A run's folder and its record are keyed by everything that changes its result (``RerunSettings``:
the proxy study's identity, the target's training setup after ``--tokens`` and the other options,
the data's fingerprint), so a re-run with other settings never reuses or records another's runs;
folder names are hashed as well as cleaned, so no study name (``..``, ``a/b``) reaches outside ``--runs``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from nas.arch import ArchConfig
from nas.errors import UsageError
from runners.presets import Preset
from search_spaces.transfer import Transfer, transfer_shape


@dataclass(frozen=True)
class PlannedShape:
    proxy_key: str
    proxy_rank: int
    role: str  # baseline | candidate
    transfer: Transfer


@dataclass(frozen=True)
class PlannedRun:
    shape: PlannedShape
    seed: int
    folder: Path

    @property
    def target(self) -> ArchConfig:
        assert self.shape.transfer.target is not None
        return self.shape.transfer.target


@dataclass(frozen=True)
class RerunSettings:
    """What makes two re-runs of one shape and seed the same run: the proxy study (its name and identity), the
    target preset's training setup as run (``--tokens`` applied; run-only options such as threads left out) and
    the data's token fingerprint. ``digest`` names their folders and tags their records."""

    proxy_study: str
    proxy_identity: dict
    preset: str
    train: dict
    data_fingerprint: str

    @property
    def digest(self) -> str:
        blob = json.dumps([self.proxy_study, self.proxy_identity, self.preset, self.train, self.data_fingerprint],
                          sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:10]


def safe_name(text: str) -> str:
    """A study or preset name as one folder name that stays inside its parent: cleaned to ``[A-Za-z0-9._-]``,
    never starting with a dot, plus a hash of the exact name (``a/b`` and ``a_b`` differ, ``..`` stays inside)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")[:60] or "study"
    return f"{cleaned}-{hashlib.sha1(text.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


@dataclass(frozen=True)
class ProxyRanking:
    """What a re-run needs of the proxy study, as plain values (the command line reads it from the storage):
    its name, baseline, shapes in the board's order (the shrunk ranking readers see) and space description."""

    name: str
    baseline_key: str | None
    ranked: tuple[tuple[int, str], ...]  # (rank, key), rank 1 first
    archs: dict[str, ArchConfig]  # every ranked shape
    space: dict


def plan_shapes(proxy: ProxyRanking, preset: Preset, top: int) -> list[PlannedShape]:
    """The baseline and the ``top`` best other shapes, each carried to ``preset``."""
    if not proxy.ranked:
        raise UsageError(f"study {proxy.name!r} has no completed training yet: nothing to re-run")
    if proxy.baseline_key is None or proxy.baseline_key not in {key for _, key in proxy.ranked}:
        raise UsageError(f"study {proxy.name!r} has no completed baseline: its gains cannot be checked")
    missing = [key for _, key in proxy.ranked if key not in proxy.archs]
    if missing:
        raise UsageError(f"study {proxy.name!r} holds no shape for {missing[0]}")
    others = [key for _, key in proxy.ranked if key != proxy.baseline_key][:top]
    return carry_shapes(proxy, preset, others, "candidate")


def carry_shapes(proxy: ProxyRanking, preset: Preset, keys: list[str], role: str) -> list[PlannedShape]:
    """The baseline (role ``baseline``) and the shapes ``keys`` (role ``role``), each carried to ``preset``
    (``search_spaces.transfer``) with its board rank; ``UsageError`` when the baseline cannot be carried."""
    rank = {key: r for r, key in proxy.ranked}
    proxy_baseline = proxy.archs[proxy.baseline_key]  # type: ignore[index]
    shapes = []
    for key in [proxy.baseline_key, *(k for k in keys if k != proxy.baseline_key)]:
        carried = transfer_shape(proxy.archs[key], proxy.space, proxy_baseline, preset.baseline)  # type: ignore[index]
        if key == proxy.baseline_key and not carried.ok:
            raise UsageError(f"the baseline of {proxy.name!r} cannot be carried to {preset.name}: {carried.refused}")
        shapes.append(PlannedShape(key, rank.get(key, 0), "baseline" if key == proxy.baseline_key else role,  # type: ignore[arg-type]
                                   carried))
    return shapes


def plan_runs(shapes: list[PlannedShape], seeds: int, runs_dir: Path, settings: RerunSettings) -> list[PlannedRun]:
    """One run per carried shape and seed, in ranking order (the baseline first), each with its folder."""
    root = runs_dir / safe_name(settings.proxy_study) / f"{safe_name(settings.preset)}-{settings.digest}"
    runs = []
    for shape in sorted((s for s in shapes if s.transfer.ok), key=lambda s: (s.role != "baseline", s.proxy_rank)):
        digest = hashlib.sha1(shape.transfer.target.key().encode()).hexdigest()[:10]
        for seed in range(seeds):
            runs.append(PlannedRun(shape, seed, root / f"rank{shape.proxy_rank:03d}-{digest}" / f"seed{seed}"))
    return runs
