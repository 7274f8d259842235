"""Section 5: how the search went: its history, the pruning curves, parameter importances, the Pareto front.

The history is drawn from the trained trials with the best *ranked loss* so far (what the
leaderboard ranks by: the baseline's mean plus the shape's shrunk paired difference,
``nas.stats.shrinkage``); Optuna's own "best value" line would follow the single luckiest trial.
Pruning curves, importances and the Pareto front are Optuna's (``optuna.visualization``,
``optuna.importance``), drawn on a copy of the study that holds its trained trials only:
duplicates (answered from an earlier trial) would count a shape twice.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState

from nas.stats.board import lowest_ranked_loss
from nas.stats.scores import ShapeScores
from nas.study.records import counts, loss_of
from reports.frame import StudyData
from reports.page import BASELINE_COLOUR, Section, plot_text
from reports.summary import shape_label

ROLE_COLOURS = {"baseline": BASELINE_COLOUR, "member": "#22558c", "sampled": "#22558c", "replicate": "#1b9e77",
                "race": "#1b9e77"}

MIN_IMPORTANCE_TRIALS = 10  # completed trainings below which fANOVA's importances say nothing


def trained(data: StudyData) -> list[FrozenTrial]:
    """The trained trials (complete, pruned), in the study's order."""
    return [t for t in data.trials if counts(t) and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def trained_copy(data: StudyData) -> optuna.Study:
    """An in-memory study holding the trained trials only (``trained``; numbered afresh from 0)."""
    copy = optuna.create_study(directions=data.directions, study_name=data.name)
    copy.add_trials(trained(data))
    return copy


def best_so_far(data: StudyData, completed: list[FrozenTrial]) -> tuple[list[int], list[float]]:
    """(trial number, the board's best ranked loss among the shapes trained so far) as each training arrives.

    The leaderboard's ranking (``nas.stats.shrinkage``: the baseline's mean plus each shape's shrunk difference from
    it) recomputed after every training, on the trainings so far.
    """
    scores: dict[str, ShapeScores] = {}
    steps_x, steps_y = [], []
    for t in completed:
        key = t.user_attrs["key"]
        old = scores.get(key, ShapeScores(key, (), (), ()))
        scores[key] = ShapeScores(key, (*old.trials, t.number), (*old.seeds, int(t.user_attrs.get("seed", 0))),
                                  (*old.losses, loss_of(t)))
        steps_x.append(t.number)
        steps_y.append(lowest_ranked_loss(scores, data.baseline_key))
    return steps_x, steps_y


def history_figure(data: StudyData) -> go.Figure:
    trained = [t for t in data.trials if counts(t) and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    fig = go.Figure()
    for role in sorted({t.user_attrs.get("role", "sampled") for t in trained}):
        group = [t for t in trained if t.user_attrs.get("role", "sampled") == role]
        done = [t for t in group if t.state == TrialState.COMPLETE]  # pruned ones: see the intermediate values
        colour = ROLE_COLOURS.get(role, "#7570b3")
        fig.add_trace(go.Scatter(x=[t.number for t in done], y=[loss_of(t) for t in done], mode="markers",
                                 name=role, marker={"color": colour, "size": 6},
                                 text=[plot_text(shape_label(data, t.user_attrs["key"])) for t in done],
                                 hovertemplate="#%{x} %{text}<br>loss %{y:.4f}<extra></extra>"))
    steps_x, steps_y = best_so_far(data, [t for t in trained if t.state == TrialState.COMPLETE])
    fig.add_trace(go.Scatter(x=steps_x, y=steps_y, mode="lines", line_shape="hv",
                             name="best shape's ranked loss so far<br>(as nas best ranks; seeds can raise it)",
                             line={"color": "#1d2733", "width": 2}))
    fig.update_xaxes(title_text="trial")
    fig.update_yaxes(title_text="validation loss")
    pruned = "" if data.multi_objective else "; pruned ones are in the next chart"  # several objectives: no pruning
    fig.update_layout(height=420, title=f"Optimisation history (completed trainings{pruned})",
                      margin={"t": 50, "l": 60, "r": 20, "b": 50})
    return fig


def _importances(section: Section, study: optuna.Study, target: Callable[[FrozenTrial], float] | None) -> None:
    """fANOVA parameter importances of the completed trainings, or a note saying why there are none."""
    try:
        fig = optuna.visualization.plot_param_importances(study, target=target, target_name="loss")
        names = list(fig.data[0].y) if fig.data else []
        # every bar named: plotly's automatic ticks left one of three bars without its label at the old height
        fig.update_yaxes(tickmode="array", tickvals=names, ticktext=names, automargin=True)
        fig.update_layout(height=200 + 40 * max(1, len(names)), title="Parameter importances (fANOVA, on the loss)")
        section.figures.append(fig)
    except (ValueError, RuntimeError, ZeroDivisionError) as error:
        section.notes.append(f"Parameter importances: not available ({str(error).splitlines()[0][:160]}).")


def readable_pareto(fig: go.Figure, names: list[str], numbers: list[int]) -> None:
    """Optuna's Pareto plot made readable: the front in one solid colour and the rest in grey (its colour scales by
    trial number drew trial 0, often the baseline on the front, near-white), and a hover of the trial and its values
    (its hover was the trial's whole JSON, training curves included: a screen-high box), under the study's own trial
    numbers (``numbers[i]``: trial ``i`` of the trained copy it is drawn from, which numbers them afresh)."""
    for trace in fig.data:
        front = trace.name == "Best Trial" or (trace.hovertemplate or "").endswith("<extra>Best Trial</extra>")
        copied = list(trace.marker.color) if trace.marker.color is not None else []
        trace.marker.color = "#c0392b" if front else "#9aa5b1"
        trace.marker.colorscale = None
        trace.marker.showscale = False
        trace.customdata = [numbers[int(n)] for n in copied]
        trace.name = "on the front" if front else "other trials"
        trace.showlegend = True
        trace.text = None
        trace.hovertemplate = ("trial %{customdata}<br>" + f"{names[0]} %{{x}}<br>{names[1]} %{{y}}"
                               + "<extra></extra>") if len(names) == 2 else "trial %{customdata}<extra></extra>"


def dynamics_section(data: StudyData) -> Section:
    section = Section("dynamics", "Search dynamics",
                      "Read off whether the search still improves (history), where the pruner stopped shapes "
                      "(intermediate values), which parameters decided the loss (importances) and, with several "
                      "objectives, the trade-off front.")
    copy = trained_copy(data)
    complete = copy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete and not copy.get_trials(deepcopy=False, states=(TrialState.PRUNED,)):
        section.empty = "no trial has trained a shape to a conclusion yet"
        return section
    section.figures.append(history_figure(data))  # the loss as the board ranks it: several objectives too
    if data.multi_objective:  # the lead sentence promises them: say why there are none (it said nothing)
        section.notes.append("Intermediate values: none for a study of several objectives (Optuna takes no "
                             "intermediate report from one, and prunes single-objective studies only).")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not data.multi_objective and any(t.intermediate_values for t in copy.get_trials(deepcopy=False)):
            fig = optuna.visualization.plot_intermediate_values(copy)
            fig.update_layout(height=420, showlegend=False, title="Intermediate values (validation loss during "
                              "training; pruned trials stop early)")
            fig.update_xaxes(title_text="training tokens")
            section.figures.append(fig)
        target = (lambda t: t.values[0]) if data.multi_objective else None
        if not complete:  # Optuna's plot would log a warning line of its own and draw nothing
            section.notes.append("Parameter importances: not available (no trial has completed a training: they "
                                 "were pruned or failed).")
        elif len(complete) < MIN_IMPORTANCE_TRIALS:  # a forest of 2 trials drew "ffn_draw 0.92"
            section.notes.append(f"Parameter importances: not drawn from {len(complete)} completed training"
                                 f"{'s' if len(complete) > 1 else ''} (fANOVA's forest needs at least "
                                 f"{MIN_IMPORTANCE_TRIALS} to say which parameter decided the loss).")
        else:
            _importances(section, copy, target)
        if data.multi_objective and len(complete) >= 1:
            names = [o.replace("_", " ") for o in data.objectives]
            fig = optuna.visualization.plot_pareto_front(copy, target_names=names)
            readable_pareto(fig, names, [t.number for t in trained(data)])
            fig.update_layout(height=420, title="Pareto front")
            section.figures.append(fig)
    return section
