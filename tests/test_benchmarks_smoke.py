"""``python -m benchmarks --smoke`` runs every figure for a few steps and writes a well-formed report.

No timing assertions: the smoke run proves the harness works, its numbers mean nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import FIGURES
from benchmarks.harness import Figure, markdown, sandwich

ROOT = Path(__file__).resolve().parents[1]
REPORT_ONLY = ("hourglass_cost", "proposals", "proxy_noise", "proxy_fidelity")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, nas_cache: str) -> tuple[dict, str, str]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NAS_CACHE": nas_cache})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads((out / "benchmarks.json").read_text())
    return data, (out / "benchmarks.md").read_text(), proc.stdout


def test_smoke_json_has_every_figure_with_rows_and_a_verdict(smoke_run) -> None:
    data, _, _ = smoke_run
    assert [f["number"] for f in data["figures"]] == list(range(1, len(FIGURES) + 1))
    assert [f["name"] for f in data["figures"]] == list(FIGURES)
    for figure in data["figures"]:
        assert figure["method"] != "crashed", figure["summary"]
        assert figure["smoke"] is True
        assert figure["rows"], figure["name"]
        # report-only figures carry no verdict; every other one a real True/False against its target
        assert figure["passed"] is None if figure["name"] in REPORT_ONLY else isinstance(figure["passed"], bool)
        for key in ("title", "target", "summary", "columns", "seconds"):
            assert figure[key] not in ("", None), (figure["name"], key)
        for row in figure["rows"]:
            assert set(row) <= set(figure["columns"]), (figure["name"], set(row) - set(figure["columns"]))


def test_smoke_json_records_the_machine_versions_and_the_command(smoke_run) -> None:
    data, _, _ = smoke_run
    machine = data["machine"]
    for key in ("date_utc", "cpu", "cores", "threads", "torch", "optuna", "python", "env", "total_seconds"):
        assert machine.get(key) not in (None, ""), key
    assert machine["env"]["MALLOC_MMAP_MAX_"] is not None  # the re-exec set the allocator variables
    assert machine["fused_cpu_kernels"].startswith(("on (", "off: "))
    assert data["command"].startswith("python -m benchmarks --smoke")


def test_smoke_markdown_has_the_summary_table_and_one_section_per_figure(smoke_run) -> None:
    data, md, stdout = smoke_run
    assert "| # | figure | target | result | verdict |" in md
    for figure in data["figures"]:
        assert f"## {figure['number']}. {figure['title']}" in md
        assert "| " + " | ".join(figure["columns"]) + " |" in md
    assert "Smoke run" in md
    assert "wrote" in stdout


def test_sandwich_pairs_every_contender_with_its_neighbouring_reference_blocks() -> None:
    calls: list[str] = []
    ratios = sandwich(lambda: calls.append("R"), {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                      rounds=2, warmup=0)
    assert calls == ["R", "a", "R", "b", "R", "R", "b", "R", "a", "R"]
    assert set(ratios) == {"a", "b"} and all(r.rounds == 2 and r.median > 0 for r in ratios.values())


def test_a_contenders_reference_time_is_the_one_its_ratio_divides_by(monkeypatch) -> None:
    """Figure 1's "uniform tokens/s" column was the median over every reference block, while each row's ratio used
    the blocks beside it: a reference slowed beside one contender showed in that row's ratio but not its column."""
    import benchmarks.harness

    durations = iter([1.0, 1.0, 1.0, 1.0, 5.0])  # R a R b R: the last reference block ran under load

    def timed(fn, device):
        fn()
        return next(durations)

    monkeypatch.setattr(benchmarks.harness, "timed", timed)
    ratios = sandwich(lambda: None, {"a": lambda: None, "b": lambda: None}, rounds=1, warmup=0)
    assert (ratios["a"].ref_seconds, ratios["a"].median) == (1.0, 1.0)
    assert (ratios["b"].ref_seconds, ratios["b"].median) == (3.0, 3.0)


def test_markdown_renders_a_figure_without_rows() -> None:
    figure = Figure(number=9, name="x", title="X", target="t", method="m", columns=["a"], passed=None, summary="s")
    info = {"date_utc": "d", "cpu": "c", "cores": 2, "cores_usable": 2, "threads": 2, "device": "cpu",
            "python": "3", "torch": "2", "transformers": None, "optuna": "4", "numpy": "1", "env": {}}
    text = markdown([figure], info, "python -m benchmarks")
    assert "## 9. X" in text and "report" in text


def test_nas_bench_runs_the_same_harness(tmp_path: Path, nas_cache: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "nas.cli", "bench", "--smoke", "--only", "7", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NAS_CACHE": nas_cache})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert [f["name"] for f in data["figures"]] == ["space_scaling"] and data["figures"][0]["smoke"] is True


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


@pytest.mark.parametrize("args, named", [(["--only", "14"], "14"), (["--only", "1,nope"], "nope"),
                                         (["--device", "tpu"], "tpu"), (["--threads", "-1"], "-1"),
                                         # ",," crashed after running nothing, "" ran every figure
                                         (["--only", ",,"], "--only ',,' names no figure"),
                                         (["--only", ""], "--only '' names no figure"),
                                         # a traceback per figure
                                         pytest.param(["--device", "cuda"], "this machine has no 'cuda' device",
                                                      marks=NO_CUDA)])
def test_nas_bench_bad_options_are_one_line_and_exit_2(args: list[str], named: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "nas.cli", "bench", *args, "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr
    assert not (tmp_path / "benchmarks.json").exists()


def test_nas_bench_without_the_bench_extra_names_it_in_one_line(tmp_path: Path) -> None:
    """`pip install -e .` has no transformers: figure 2 cannot run, and says which extra to install."""
    code = ("import sys; sys.modules['transformers'] = None; from nas.cli import main; "
            f"sys.argv = ['nas', 'bench', '--smoke', '--out', {str(tmp_path)!r}]; main()")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "figure 2 (vs_hf) needs the Python package 'transformers'" in lines[0]
    assert "pip install -e '.[bench]'" in lines[0] and "--only 1,3,4,5,6,7,8" in lines[0]


def test_the_reference_panel_and_the_proxy_fidelity_figure_run_end_to_end(tmp_path, nas_cache) -> None:
    """The generators of the stored data (``benchmarks/data``), on tiny shapes and tokens."""
    env = {**os.environ, "NAS_CACHE": nas_cache}
    panel, fidelity = tmp_path / "panel.json", tmp_path / "fidelity.json"
    for args in (["benchmarks.reference_panel", "--smoke", "--out", str(panel), "--processes", "1"],
                 ["benchmarks.proxy_fidelity", "--smoke", "--panel", str(panel), "--out", str(fidelity),
                  "--processes", "1"]):
        proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads(panel.read_text())
    assert len(data["runs"]) == 3 * 2 and data["made"]["commit"] and set(data["quality"]) >= {
        "seed_sd", "paired_sd", "separation", "halves_kendall_tau"}
    figures = json.loads(fidelity.read_text())
    assert [len(c["runs"]) for c in figures["configs"]] == [6, 6]
    assert all(c["made"]["commit"] and c["made"]["machine"]["cores"] and c["made"]["load_average"]
               for c in figures["configs"])  # where each configuration's runs came from
    assert set(figures["configs"][0]["result"]["scores"]) == {"final", "train_mean", "train_last_half", "val_auc",
                                                              "extrapolated"}


def test_the_docs_plots_of_figures_10_to_13_draw_every_recorded_row() -> None:
    """``benchmarks/plots.py`` draws the recorded data (``docs/make_images.py`` renders it): one point per row."""
    import json

    from benchmarks.plots import DATA, figure_10, figure_11, figure_12, figure_13

    rows = json.loads((DATA / "ranking_simulation.json").read_text())["rows"]
    drawn = sum(len(trace.x) for trace in figure_10().data)
    assert drawn == len(rows) >= 15
    fidelity = json.loads((DATA / "proxy_fidelity.json").read_text())
    points = sum(len(c["result"]["scores"]) for c in fidelity["configs"])
    separation = [t for t in figure_12().data if t.xaxis in (None, "x") and t.x[0] is not None]
    assert len(separation) == points >= 15
    curves = [c["result"]["pruning_spearman"] for c in fidelity["configs"] if c["result"].get("pruning_spearman")]
    assert sum(len(t.x) for t in figure_11().data) == sum(len(c) for c in curves) >= 40
    simulated = json.loads((DATA / "rule_simulation.json").read_text())["rows"]
    drawn = [sum(v is not None for v in trace.y) for trace in figure_13().data]  # 4 shares, one point a row each
    assert drawn == [len(simulated)] * 4 and len(simulated) >= 3 and min(r["studies"] for r in simulated) >= 1000


def test_the_stored_hourglass_panel_gives_the_width_depth_optimum_the_docs_quote(capsys) -> None:
    from benchmarks.reference_panel import main

    assert main(["--space", "hourglass", "--summary"]) == 0
    printed = capsys.readouterr().out
    assert "halves tau +0.76 [+0.59, +0.82]" in printed
    assert "width-depth optimum d_model/L 167 [130, 239] over 17 shapes" in printed  # docs/concepts/proxy.md
    assert "K = 1 alone 134 [107, 189]" in printed


def test_fused_attention_benchmark_smoke_writes_kernel_and_step_ratios(tmp_path) -> None:
    """``python -m benchmarks.fused_attention --smoke``: every kernel row either a ratio or "no fused kernel", every
    step shape a positive ratio, the peak and the machine beside them."""
    import json

    from benchmarks import fused_attention

    out = tmp_path / "fused_attention.json"
    assert fused_attention.main(["--smoke", "--noise", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["smoke"] and data["peak_gflops"] > 0 and data["machine"]["cpu"]
    assert {(row["head dim"], row["group"]) for row in data["kernels"]} == {(8, 1), (8, 4), (48, 1)}
    for row in data["kernels"]:
        assert (row["ratio"] is None) == (row["head dim"] == 48)
        assert row["ratio"] is None or row["ratio"] > 0
    assert [row["shape"] for row in data["steps"]] == list(fused_attention.STEP_SHAPES)
    assert all(row["ratio"] > 0 and row["fused tokens/s"] > 0 for row in data["steps"])
    for row in data["noise"]:  # real trainings with each kernel, a finite score at every seed
        assert len(row["fused"]) == len(row["blocked"]) == row["seeds"] == 3
        assert all(2.0 < loss < 6.0 for loss in row["fused"] + row["blocked"])
        assert 0 <= row["paired t p"] <= 1 and 0 <= row["F p"] <= 1
