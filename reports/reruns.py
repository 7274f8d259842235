"""Section 9: full-scale re-runs (``nas rerun``) against the proxy's ranking: ranks side by side, Kendall tau.

``nas rerun`` writes each target preset's runs into a study of its own in the same storage,
named ``rerun_study_name(proxy study, preset)`` and marked with the study user attr
``nas:rerun_of``; each completed run carries ``proxy_key`` (the shape at the proxy) and ``seed``.
Kendall tau compares the shapes' proxy ranks (the leaderboard's) with their mean full-scale loss; its
interval is a bootstrap over the re-runs' seeds (``nas.stats.comparisons.kendall_tau``).
"""

from __future__ import annotations

import shlex
from statistics import fmean

import optuna
import pandas as pd
import plotly.graph_objects as go
from optuna.trial import TrialState

from nas.stats.comparisons import kendall_tau, paired_gain
from nas.study.records import RERUN_MARK
from reports.frame import StudyData, rerun_scores
from reports.page import Section, plot_text, table, text
from reports.summary import shape_label


def read_reruns(storage: optuna.storages.BaseStorage | str, proxy_study: str) -> pd.DataFrame | None:
    """Every completed re-run of ``proxy_study``'s shapes in ``storage``: preset, proxy key, seed, loss, speed.

    The re-run studies are found by their user attrs alone (``get_all_studies``: no study's trials are read but
    theirs; the proxy study's own may be thousands)."""
    if isinstance(storage, str):
        storage = optuna.storages.get_storage(storage)
    rows = []
    for frozen in storage.get_all_studies():
        if frozen.user_attrs.get(RERUN_MARK) != proxy_study:
            continue
        study = optuna.load_study(study_name=frozen.study_name, storage=storage)
        preset = frozen.user_attrs.get("nas:rerun_label") or frozen.user_attrs.get("nas:preset", frozen.study_name)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            a = t.user_attrs
            rows.append({"preset": preset, "proxy_key": a.get("proxy_key"), "key": a.get("key"),
                         "seed": a.get("seed"), "role": a.get("role"), "val_loss": t.values[0],
                         "tokens_per_s": a.get("tokens_per_s"), "mfu": a.get("mfu"), "tokens": a.get("tokens_seen")})
    return pd.DataFrame(rows) if rows else None


def held_text(data: StudyData, runs: pd.DataFrame, preset: str) -> str:
    """Whether the answer's pick kept its gain over the baseline at full length: its paired gain on the re-runs'
    common seeds with the 95 % interval (held: the interval above 0; reversed: below; else not resolved)."""
    pick = data.answer().best
    scores = rerun_scores(runs)
    if pick is None or pick == data.baseline_key:
        return "the proxy's answer picked the baseline: no gain to check"
    if pick not in scores or data.baseline_key not in scores:
        return f"the pick ({shape_label(data, pick)}) and the baseline were not both re-run at {preset}"
    gain = paired_gain(scores[pick], scores[data.baseline_key])  # type: ignore[index]
    if gain is None:
        return f"the pick and the baseline share no seed at {preset}"
    if gain.low_pct is None:
        return (f"the pick ({shape_label(data, pick)}) at full length: {gain.gain_pct:+.2f} % over the baseline on "
                f"{gain.n} common seed (an interval needs 2)")
    verdict = "held" if gain.low_pct > 0 else "reversed" if gain.high_pct < 0 else "not resolved at this many seeds"
    return (f"the pick ({shape_label(data, pick)}) at full length: {gain.gain_pct:+.2f} % over the baseline (95 % "
            f"CI [{gain.low_pct:+.2f}, {gain.high_pct:+.2f}], {gain.n} paired seeds): the proxy's gain {verdict}")


def board_ranks(data: StudyData) -> dict[str, int]:
    """Each shape's rank on the study's leaderboard (1 best; the shrunk ranking ``nas best`` prints)."""
    return {} if data.board.empty else {str(key): int(rank) for key, rank in zip(data.board["key"], data.board["rank"])}


def reruns_section(data: StudyData) -> Section:
    section = Section("reruns", "Full-scale re-runs",
                      "Read off whether the proxy's ranking held when the best shapes and the baseline were trained "
                      "for real: proxy rank against full rank, and Kendall tau with its interval.")
    if data.reruns is None or data.reruns.empty:
        storage = f" --storage {shlex.quote(data.storage)}" if data.storage else ""
        section.empty = ("no full-scale re-runs are stored for this study yet: `nas rerun --study-name "
                         f"{shlex.quote(data.name)}{storage} --top K --preset NAME` trains the best shapes and the "
                         "baseline at a target preset and writes them here"
                         + data.storage_note)
        return section
    for preset, runs in data.reruns.groupby("preset", sort=True):
        full = {key: list(group["val_loss"]) for key, group in runs.groupby("proxy_key")}
        proxy = {key: list(data.scores[key].losses) for key in full if key in data.scores}
        board_rank = board_ranks(data)
        proxy_rank = {key: board_rank[key] for key in proxy if key in board_rank}  # the board's (shrunk) rank
        agreement = kendall_tau(proxy_rank, full)
        full_rank = {key: i for i, key in enumerate(sorted(full, key=lambda k: fmean(full[k])), start=1)}
        rows = [{"shape": shape_label(data, key) + (" (baseline)" if key == data.baseline_key else ""),
                 "proxy rank": proxy_rank.get(key), "proxy mean loss": fmean(proxy[key]) if key in proxy else None,
                 "full rank": full_rank[key], "full mean loss": fmean(full[key]), "full seeds": len(full[key]),
                 "tokens/s": fmean(runs[runs["proxy_key"] == key]["tokens_per_s"].dropna())
                 if runs[runs["proxy_key"] == key]["tokens_per_s"].notna().any() else None}
                for key in sorted(full, key=lambda k: full_rank[k])]
        verdict = (f"preset {preset}: {agreement.text()}"
                   if agreement else f"preset {preset}: fewer than 2 shapes with both proxy and full results")
        verdict += "; " + held_text(data, runs, preset)
        formats = {"proxy mean loss": "{:.4f}", "full mean loss": "{:.4f}", "tokens/s": "{:,.0f}"}
        section.html += f'<p class="verdict">{text(verdict)}</p>' + table(rows, formats=formats)
        if proxy:
            fig = go.Figure(go.Scatter(
                x=[fmean(proxy[k]) for k in proxy], y=[fmean(full[k]) for k in proxy], mode="markers+text",
                text=[str(proxy_rank.get(k, "")) for k in proxy], textposition="top center",
                hovertext=[plot_text(shape_label(data, k)) for k in proxy], name=str(preset)))
            fig.update_xaxes(title_text="proxy mean validation loss")
            fig.update_yaxes(title_text=f"full-scale mean validation loss ({plot_text(preset)})")
            fig.update_layout(height=400, title=f"Proxy against full scale ({plot_text(preset)}); labels: proxy rank",
                              margin={"t": 40, "l": 60, "r": 20, "b": 50})
            section.figures.append(fig)
    return section
