"""The layering of the packages, as a test that fails when an import breaks it.

The flow is ``CLI -> space -> ArchConfig -> runner -> result -> storage -> report``:

- counting and validating shapes needs no torch: ``search_spaces`` and ``nas.arch`` (with the
  leaves they share: ``nas.errors``, ``nas.units``, ``nas.configs``) import no torch, directly
  or through another project module;
- runners train and score a shape and report through a callback: they never import the study
  or the command line;
- reports read a study and draw it: they never import runners or the model (nor torch), nor the search
  loop (``nas.study`` and ``nas.rerun``, except the stored trial format ``nas.study.records``);
- the search loop (``nas.study``, ``nas.rerun``) never imports the reports: it decides from the statistics,
  and the dashboard note reaches it as a callback from the command line;
- the statistics of a study (``nas.stats``) are pure functions of the scores: they import neither the
  search loop, the re-runs, the reports nor the command line, and no torch or Optuna;
- nothing below the command line imports it (the console script's entry ``nas.console`` and ``python -m nas`` sit
  above it: they load it);
- Optuna's private API is reached from ``nas/study/optuna_internals.py`` only.

Imports are read from the source (every ``import`` statement, inside functions too, except
under ``if TYPE_CHECKING:``), and a module's imports include the packages around it, since
importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nas", "search_spaces", "runners", "reports", "benchmarks")
TORCH_FREE = ("search_spaces", "nas.arch", "nas.errors", "nas.units", "nas.configs")
INTERNALS = "nas.study.optuna_internals"
ENTRY = ("nas.console", "nas.__main__")  # the console script and `python -m nas`: above the command line
SEARCH_LOOP = ("nas.study", "nas.rerun")
STORED_FORMAT = ("nas.study", "nas.study.records")  # what readers may import of the study package
# private Optuna names: only INTERNALS may touch them
PRIVATE_OPTUNA = {"_storage", "_trial_id", "_study_id", "_cached_frozen_trial", "_backend", "_create_scoped_session",
                  "_datetime_start_utc", "_rdb"}


def module_files() -> dict[str, Path]:
    """Every project module by dotted name (``nas.study.trial``; a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports there are for annotations only)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(project modules, top-level third-party packages) that ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".strip(".")
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules)
    project, external = set(), set()
    for target in targets:
        top = target.split(".")[0]
        if top in PACKAGES:
            parts = target.split(".")
            project.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules)
        elif top:
            external.add(top)
    project.discard(name)
    return project, external


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = module_files()
    graph, external = {}, {}
    for name, path in modules.items():
        graph[name], external[name] = imports_of(path, name, modules)
        parts = name.split(".")  # importing a module runs its packages' __init__ first
        graph[name].update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules)
    return graph, external


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every project module that importing ``start`` imports, ``start`` included."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(graph: dict[str, set[str]], external: dict[str, set[str]]) -> list[str]:
    """Every broken rule of the module docstring, as ``module -> what it reaches``."""
    broken = []
    for module in graph:
        reached = closure(graph, module)
        if any(under(module, p) for p in TORCH_FREE):
            broken += [f"{module} -> torch (via {m})" for m in sorted(reached) if "torch" in external[m]]
        if under(module, "runners"):
            broken += [f"{module} -> {m}" for m in sorted(reached) if under(m, "nas.study") or under(m, "nas.cli")]
        if under(module, "reports"):
            broken += [f"{module} -> {m}" for m in sorted(reached) if under(m, "runners") or under(m, "nas.model")]
            broken += [f"{module} -> torch (via {m})" for m in sorted(reached) if "torch" in external[m]]
        if under(module, "reports"):
            broken += [f"{module} -> {m} (the search loop)" for m in sorted(reached)
                       if any(under(m, p) for p in SEARCH_LOOP) and m not in STORED_FORMAT]
        if any(under(module, p) for p in SEARCH_LOOP):
            broken += [f"{module} -> {m} (a report)" for m in sorted(reached) if under(m, "reports")]
        if under(module, "nas.stats"):
            broken += [f"{module} -> {m}" for m in sorted(reached)
                       if any(under(m, p) for p in (*SEARCH_LOOP, "reports", "nas.cli"))]
            broken += [f"{module} -> {lib} (via {m})" for m in sorted(reached) for lib in ("torch", "optuna")
                       if lib in external[m]]
        if not under(module, "nas.cli") and module not in ENTRY:
            broken += [f"{module} -> {m} (the CLI)" for m in sorted(reached) if under(m, "nas.cli")]
    return broken


def test_the_layering_holds():
    graph, external = import_graph()
    assert "nas.study.trial" in graph and "runners.proxy" in graph["nas.study.trial"]  # the reader reads imports
    assert violations(graph, external) == []


@pytest.mark.parametrize("edge, says", [
    (("search_spaces.base", "runners.proxy"), "search_spaces.base -> torch"),
    (("runners.proxy", "nas.study.records"), "runners.proxy -> nas.study.records"),
    (("reports.leaderboard", "nas.model.transformer"), "reports.leaderboard -> nas.model.transformer"),
    (("nas.study.worker", "nas.cli.progress"), "nas.study.worker -> nas.cli.progress (the CLI)"),
    (("nas.study.worker", "reports.dashboard_note"), "nas.study.worker -> reports.dashboard_note (a report)"),
    (("nas.rerun.plan", "reports.frame"), "nas.rerun.plan -> reports.frame (a report)"),
    (("reports.summary", "nas.study.adaptive"), "reports.summary -> nas.study.adaptive (the search loop)"),
    (("nas.stats.shrinkage", "nas.study.records"), "nas.stats.shrinkage -> nas.study.records"),
    (("nas.stats.adaptive", "reports.frame"), "nas.stats.adaptive -> reports.frame"),
    (("nas.stats.race", "runners.proxy"), "nas.stats.race -> torch"),
])
def test_a_forbidden_import_is_caught(edge, says):
    graph, external = import_graph()
    graph[edge[0]] = graph[edge[0]] | {edge[1]}
    assert any(v.startswith(says) for v in violations(graph, external))


def module_circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Modules that import each other, directly or through other modules, as sets (the graph's cycles)."""
    circles: list[set[str]] = []
    for module in sorted(graph):
        circle = {m for m in closure(graph, module) if module in closure(graph, m)}
        if len(circle) > 1 and circle not in circles:
            circles.append(circle)
    return circles


def module_imports() -> dict[str, set[str]]:
    """Module -> the project modules its own import statements name (packages' ``__init__`` left out: importing a
    package's module runs its ``__init__``, and a package that gathers its modules would tie all of them)."""
    modules = module_files()
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    return {name: imports_of(path, name, modules)[0] - packages for name, path in modules.items()
            if name not in packages}


def test_no_two_modules_import_each_other():
    """Issue 52: ``nas.cli.export_hf`` took ``warn_skipped`` from ``nas.cli.results``, which took
    ``export_model_dir`` from it (both now take it from ``nas.cli.skipped``), and ``reports.kv_cache`` and
    ``reports.summary`` imported each other (the answer is now one value, ``nas.stats.answer``, both render)."""
    assert module_circles(module_imports()) == []
    assert module_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_optuna_private_api_is_used_in_one_module_only():
    found = []
    for name, path in module_files().items():
        if name == INTERNALS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            own = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_OPTUNA and not own:
                found.append(f"{name}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optuna") \
                    and any(part.startswith("_") for part in (node.module or "").split(".")):
                found.append(f"{name}:{node.lineno} from {node.module}")
    assert found == []


def test_no_command_catches_usage_errors_itself():
    """One error type, rendered by the CLI framework (nas.cli.errors) and nowhere else."""
    found = [f"{name}:{node.lineno}" for name, path in module_files().items() if under(name, "nas.cli")
             and name != "nas.cli.errors"
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.ExceptHandler) and node.type is not None
             and "UsageError" in ast.unparse(node.type)]
    assert found == []


def test_counting_shapes_and_reading_reports_import_no_torch_at_run_time():
    code = ("import sys; import search_spaces, nas.arch, nas.configs, reports.leaderboard, nas.cli; "
            "from search_spaces.factory import SpaceOptions, build_space; build_space(SpaceOptions()).count(); "
            "print(sorted(m for m in ('torch', 'runners.proxy', 'nas.model') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
