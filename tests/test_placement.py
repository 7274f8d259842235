"""One worker per device: the placement as a pure function, and through the real worker start-up (GPUs faked)."""

from __future__ import annotations

import multiprocessing
import os

import optuna
import pytest
from optuna.trial import TrialState
from search_helpers import sqlite_url

import nas.study.parallel
from nas.errors import UsageError
from nas.study.config import SearchConfig
from nas.study.placement import (
    GPU_WORKER_THREADS,
    Placement,
    apply_placement,
    gpu_count,
    plan_placements,
    resolve_workers,
    torch_builds_for_gpus,
)
from search_spaces.factory import SpaceOptions


def test_each_worker_gets_its_own_gpu_round_robin_and_sees_only_it():
    places = plan_placements(3, "cuda", n_gpus=2, cores=32)
    assert [p.label for p in places] == ["cuda:0", "cuda:1", "cuda:0"]
    assert [p.env for p in places] == [{"CUDA_VISIBLE_DEVICES": v} for v in ("0", "1", "0")]
    assert {p.device for p in places} == {"cuda"} and {p.threads for p in places} == {GPU_WORKER_THREADS}
    eight = plan_placements(8, "auto", n_gpus=8, cores=96)
    assert [p.label for p in eight] == [f"cuda:{i}" for i in range(8)]


def test_an_inherited_cuda_visible_devices_list_is_dealt_out_not_replaced():
    places = plan_placements(3, "cuda", n_gpus=2, cores=8, visible="4,6")
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in places] == ["4", "6", "4"]
    assert [p.label for p in places] == ["cuda:4", "cuda:6", "cuda:4"]


def test_a_pinned_device_keeps_every_worker_on_it_and_a_missing_one_is_one_line():
    assert {(p.device, p.label) for p in plan_placements(2, "cuda:1", n_gpus=2, cores=8)} == {("cuda:1", "cuda:1")}
    with pytest.raises(UsageError, match=r"--device cuda:5 does not exist: this machine has 2 visible GPU\(s\)"):
        plan_placements(2, "cuda:5", n_gpus=2, cores=8)
    with pytest.raises(UsageError, match="no visible GPU"):
        plan_placements(2, "cuda", n_gpus=0, cores=8)


def test_cpu_workers_split_the_cores_and_threads_overrides_it():
    assert [p.threads for p in plan_placements(2, "cpu", n_gpus=0, cores=2)] == [1, 1]
    assert [p.threads for p in plan_placements(1, "auto", n_gpus=0, cores=2)] == [2]
    assert [p.threads for p in plan_placements(2, "cuda", n_gpus=2, cores=64, threads=9)] == [9, 9]
    assert all(p.env == {} and p.label == "cpu" for p in plan_placements(4, "cpu", n_gpus=8, cores=4))


def test_workers_auto_is_one_per_gpu_on_a_gpu_and_one_per_core_on_a_cpu():
    assert resolve_workers("auto", "cuda", n_gpus=8, cores=96) == 8
    assert resolve_workers("auto", "auto", n_gpus=4, cores=96) == 4
    assert resolve_workers("auto", "auto", n_gpus=0, cores=2) == 2
    assert resolve_workers("auto", "cuda:3", n_gpus=8, cores=96) == 1
    assert resolve_workers(3, "cuda", n_gpus=8, cores=96) == 3


def _report_environment(placement: Placement, out) -> None:
    apply_placement(placement)
    import torch  # imported after the placement, as the worker's own modules are

    out.put((os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_initialized()))


def test_a_spawned_worker_has_its_device_set_before_cuda_is_initialised():
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=_report_environment, args=(plan_placements(2, "cuda", 2, 4)[1], out))
    process.start()
    visible, initialised = out.get(timeout=120)
    process.join(timeout=60)
    assert visible == "1" and initialised is False


def test_a_search_with_two_faked_gpus_trains_each_workers_trials_on_its_own_device(tmp_path, monkeypatch):
    # the real start-up of two worker processes; the GPUs are faked (each worker trains on the CPU, one core each)
    fake = [Placement(w, "cpu", f"cuda:{w}", 1, {"CUDA_VISIBLE_DEVICES": str(w)}) for w in range(2)]
    monkeypatch.setattr(nas.study.parallel, "placements", lambda config: fake)
    storage = sqlite_url(tmp_path / "gpus.db")
    events = []
    nas.study.parallel.run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage,
                                               study_name="gpus", trials=6, workers=2,
                                               train_overrides=(("tokens", 1_024),)), on_event=events.append)
    trials = optuna.load_study(study_name="gpus", storage=storage).get_trials()
    placed = {t.user_attrs["placed_on"] for t in trials if t.state == TrialState.COMPLETE}
    assert placed and placed <= {"cuda:0", "cuda:1"}  # both, unless one worker took every trial while the other
    for e in events:                                   # started: the worker's own device, in storage and progress
        assert trials[e.number].user_attrs["placed_on"] == e.device


def test_the_slurm_recipe_runs_a_nas_search_whose_options_the_cli_accepts():
    import re
    import shlex
    from pathlib import Path

    from typer.testing import CliRunner

    from nas.cli import app

    script = (Path(__file__).resolve().parents[1] / "examples" / "slurm" / "nas-search.sbatch").read_text()
    command = re.search(r"^srun --cpus-per-task=\S+ +(nas search .*?)$", script.replace("\\\n", " "), re.M).group(1)
    command = command.replace('"$NAS_DATA"', "builtin").replace('"$NAS_STORAGE"', "postgresql://u:p@db:5432/nas")
    args = shlex.split(command)[1:]
    assert "--workers" in args and args[args.index("--workers") + 1] == "auto"
    result = CliRunner().invoke(app, [*args, "--help"])  # every option known: the help, exit 0; else exit 2
    assert result.exit_code == 0, result.output


CPU_BUILD = """from typing import Optional

__version__ = '2.13.0+cpu'
cuda: Optional[str] = None
git_version = 'cf30153c4c131c8164ee7798e5022d810682e2cb'
hip: Optional[str] = None
"""


@pytest.mark.parametrize("text, gpus", [
    (CPU_BUILD, False),
    (CPU_BUILD.replace("cuda: Optional[str] = None", "cuda: Optional[str] = '12.8'"), True),
    (CPU_BUILD.replace("hip: Optional[str] = None", "hip = '6.2.41133'"), True),
    (CPU_BUILD.replace("hip: Optional[str] = None", ""), True),  # a field missing: torch is asked
    (CPU_BUILD.replace("= None", "= backend()"), True),  # not a literal
    ("cuda = None\nhip = (", True),  # not Python
])
def test_a_cpu_build_of_torch_is_read_from_its_version_file_and_anything_else_asks_torch(tmp_path, text, gpus):
    """A search's parent counts GPUs without importing torch where the build has no GPU backend; a file it cannot
    read for certain leaves the count to torch itself."""
    version = tmp_path / "version.py"
    version.write_text(text)
    assert torch_builds_for_gpus(version) is gpus
    assert torch_builds_for_gpus(tmp_path / "missing.py") is True


def test_the_installed_torch_is_read_as_torch_itself_says():
    import torch

    assert torch_builds_for_gpus() is (torch.version.cuda is not None or torch.version.hip is not None)
    if not torch_builds_for_gpus():
        assert gpu_count() == 0
