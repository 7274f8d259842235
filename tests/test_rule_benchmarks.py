"""The design rules' benchmarks run end to end: the fidelity table from the stored runs, a simulated study, the GPU
panel's script on the CPU."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_rules, rule_fidelity, rule_simulation


def test_the_rule_fidelity_table_reads_every_configuration_and_the_panel(tmp_path, capsys):
    out = tmp_path / "fidelity.json"
    assert rule_fidelity.main(["--out", str(out)]) == 0
    axes = {a["space"]: a for a in json.loads(out.read_text())["axes"]}
    prism = [r for r in axes["prism"]["rows"] if r["rule"] == "log2_first_heads"]
    assert len(prism) == 7 and prism[-1]["budget"].startswith("reference panel")  # six configurations and the panel
    assert prism[0]["verdict"] == "resolved" and prism[0]["estimate"] < 0  # the cpu proxy: fewer first heads hurt
    hourglass = axes["hourglass"]
    panel = next(o for o in hourglass["optima"] if o["budget"] == "reference panel")
    assert 100 < panel["d_over_L"] < 300 and panel["ci95"][0] < panel["d_over_L"] < panel["ci95"][1]
    assert "| budget | rule |" in capsys.readouterr().out


def test_a_simulated_study_of_each_kind_is_read_by_the_rule_model():
    """Below the space's size the sampler's study (one seed), at 200 trials the walk and the adaptive replicates."""
    sampled = rule_simulation.one_study((20, rule_simulation.TAU, 3))
    assert sampled["shapes"] == 20 and sampled["runs"] == 20
    assert {"reduced_layers:covered", "log2_first_heads:resolved", "log2_first_heads:mdg"} <= set(sampled)


@pytest.mark.slow
def test_the_gpu_panel_script_runs_on_the_cpu_with_smoke(tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_rules.main(["--smoke", "--seeds", "2", "--processes", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 6 and {r["status"] for r in data["runs"]} == {"ok"}
    assert [r["name"] for r in data["rules"]["rules"]] == ["reduced_layers", "log2_first_heads"]


def test_the_gpu_panel_script_refuses_to_run_without_a_gpu_unless_smoked(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert gpu_rules.main([]) == 2 and "no GPU here" in capsys.readouterr().err
