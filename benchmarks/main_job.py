"""The README's main job as a user runs it: its share of the machine's peak, where its wall time goes, the first
line's estimate against what followed, and its peak memory.

    python -m benchmarks.main_job                     # nas search --space prism --trials 200; ~6-12 min on 2 cores
    python -m benchmarks.main_job --trials 40         # a cut of it (the same first 40 trials)
    python -m benchmarks.main_job --fresh-cache       # as a fresh clone: the built-in data tokenised first

It runs ``nas search --space prism --trials N`` (the defaults: ``--workers auto``) as a subprocess in an empty folder,
measures the fp32 matmul peak with every core (``runners.peak``) before and after, and reads the finished study:

- **fraction of peak** = the training FLOPs of every trial (``flops_per_token`` x the tokens it saw: pruned ones at
  the tokens they saw) over wall time x the peak (the mean of the two readings);
- **breakdown** of the wall time x workers, each worker's timeline cut into: training matmuls and the rest of each
  training step (the train time split by the matmul kernels' share of a profiled step of the baseline, one thread),
  evaluation (``eval_time_s``), model build (``build_time_s``), the rest of a run, storage and sampler (a trial's
  span beyond its run, and the gaps between one worker's trials: reading the study, planning, asking), duplicates
  answered, process start and imports (until a worker's first trial), and idle cores (after its last); pruned work
  is reported beside it;
- **estimate error**: the first line's "the N trials left take about T" against the time from that line to the end;
- **peak memory**: the largest process's resident set (what ``/usr/bin/time`` reports), and the one the search
  itself prints in its last line.

Speed is a same-run ratio and a machine's figure: the report names the machine and its measured peak.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
OUT = DATA / "main_job.json"
ESTIMATE = re.compile(r"the (\d+) trials left take about (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")  # format_duration


def peak_flops() -> float:
    import torch

    from runners.peak import measure_matmul_peak

    torch.set_num_threads(os.cpu_count() or 1)
    return measure_matmul_peak(torch.device("cpu"))


def run_search(trials: int, folder: Path, cache: str | None, extra: list[str]) -> dict[str, Any]:
    """``nas search --space prism --trials N`` in ``folder``: its wall time, each stderr line with its time, the
    largest process's peak RSS."""
    env = {**os.environ}
    if cache is not None:
        env["NAS_CACHE"] = cache
    command = [sys.executable, "-m", "nas.cli", "search", "--space", "prism", "--trials", str(trials), *extra]
    started = time.time()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(command, cwd=folder, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.time(), line.rstrip("\n")))
            print(line, end="", file=sys.stderr, flush=True)
    ended = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"error: the search exited with {proc.returncode}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # kB -> MB: the largest descendant's
    return {"started": started, "ended": ended, "lines": lines, "peak_rss_mb": rss, "command": command}


def matmul_share(arch_dict: dict[str, Any], train_dict: dict[str, Any]) -> float:
    """The share of a training step's time spent in matmul kernels (mm, addmm and its in-place form, bmm, linear's and
    attention's), from ``torch.profiler`` over steps of the baseline at one thread, after a warm-up; the step is a
    trial's (forward, backward, clip, AdamW, and the weight average where the preset scores one)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nas.arch import ArchConfig
    from nas.model.transformer import Transformer
    from runners.config import TrainConfig
    from runners.proxy import build_optimizer, update_average

    torch.set_num_threads(1)
    arch, cfg = ArchConfig.from_dict(arch_dict), TrainConfig.from_dict(train_dict)
    torch.manual_seed(0)
    model = Transformer(arch)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    x = torch.randint(0, arch.vocab_size, (cfg.batch_size, cfg.seq_len))
    y = torch.randint(0, arch.vocab_size, (cfg.batch_size, cfg.seq_len))

    params = [p for p in model.parameters() if p.requires_grad]
    average = [p.detach().clone() for p in params] if cfg.ema_decay > 0 else None

    def step() -> None:
        model(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if average is not None:
            update_average(average, params, cfg.ema_decay)

    for _ in range(5):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events
                 if e.key in ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::matmul")
                 or "sgemm" in e.key.lower() or "flash_attention" in e.key.lower())
    return matmul / total if total else 0.0


def seconds(value: Any) -> float:
    return value.timestamp() if isinstance(value, dt.datetime) else float(value)


def breakdown(trials: list[Any], workers: int, started: float, ended: float, share: float) -> dict[str, float]:
    """Worker-seconds by where they went (module docstring); they add up to ``workers`` x the wall time."""
    by_worker: dict[int, list[Any]] = {}
    for t in trials:
        if t.datetime_start is not None and t.datetime_complete is not None:
            by_worker.setdefault(int(t.user_attrs.get("worker", 0) or 0), []).append(t)
    parts = dict.fromkeys(("training matmuls", "training, the rest of the step", "evaluation", "model build",
                           "the rest of a run", "storage and sampler", "duplicates answered",
                           "process start and imports", "idle cores (a worker done, or not started)"), 0.0)
    for w in range(workers):
        mine = sorted(by_worker.get(w, []), key=lambda t: seconds(t.datetime_start))
        if not mine:
            parts["idle cores (a worker done, or not started)"] += ended - started
            continue
        parts["process start and imports"] += seconds(mine[0].datetime_start) - started
        parts["idle cores (a worker done, or not started)"] += ended - seconds(mine[-1].datetime_complete)
        for before, after in zip(mine, mine[1:]):
            parts["storage and sampler"] += max(0.0, seconds(after.datetime_start) - seconds(before.datetime_complete))
        for t in mine:
            span = seconds(t.datetime_complete) - seconds(t.datetime_start)
            a = t.user_attrs
            if "duplicate_of" in a or a.get("wall_time_s") is None:
                parts["duplicates answered"] += span
                continue
            wall, train = float(a["wall_time_s"]), float(a.get("train_time_s") or 0.0)
            evaluation, build = float(a.get("eval_time_s") or 0.0), float(a.get("build_time_s") or 0.0)
            parts["training matmuls"] += share * train
            parts["training, the rest of the step"] += (1 - share) * train
            parts["evaluation"] += evaluation
            parts["model build"] += build
            parts["the rest of a run"] += max(0.0, wall - train - evaluation - build)
            parts["storage and sampler"] += max(0.0, span - wall)
    return parts


def estimate_error(lines: list[tuple[float, str]], ended: float) -> dict[str, Any] | None:
    """The first line's time estimate against the time that followed it."""
    for at, line in lines:
        found = ESTIMATE.search(line)
        if found:
            hours, minutes, secs = (int(g or 0) for g in found.groups()[1:])
            stated = 3600 * hours + 60 * minutes + secs
            actual = ended - at
            return {"line": line.strip(), "stated_s": stated, "actual_s": round(actual, 1),
                    "error": stated / actual - 1 if actual > 0 else None}
    return None


def printed_peak_memory(lines: list[tuple[float, str]]) -> str | None:
    last = next((line for _, line in reversed(lines) if line.startswith("done:")), "")
    found = re.search(r"peak memory (\d+) MB", last)
    return f"{found.group(1)} MB" if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.main_job", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--fresh-cache", action="store_true", help="a new data cache (as a fresh clone: the built-in "
                        "data tokenised first)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--label", default="", help="what this run measures (stored beside its figures)")
    parser.add_argument("search_args", nargs="*", help="more nas search options (after --)")
    args = parser.parse_args(argv)
    import optuna

    from benchmarks.harness import machine_info

    before = peak_flops()
    with tempfile.TemporaryDirectory(prefix="main-job-") as tmp:
        folder = Path(tmp)
        cache = str(folder / "cache") if args.fresh_cache else None
        ran = run_search(args.trials, folder, cache, args.search_args)
        url = f"sqlite:///{folder / 'nas.db'}"
        (name,) = optuna.get_all_study_names(url)
        study = optuna.load_study(study_name=name, storage=url)
        trials = study.get_trials(deepcopy=False)
    after = peak_flops()
    peak = (before + after) / 2
    counted = [t for t in trials if "duplicate_of" not in t.user_attrs and t.user_attrs.get("tokens_seen")]
    flops = sum(float(t.user_attrs["flops_per_token"]) * float(t.user_attrs["tokens_seen"]) for t in counted)
    pruned = sum(float(t.user_attrs["flops_per_token"]) * float(t.user_attrs["tokens_seen"]) for t in counted
                 if t.state == optuna.trial.TrialState.PRUNED)
    wall = ran["ended"] - ran["started"]
    workers = len({int(t.user_attrs.get("worker", 0) or 0) for t in trials}) or 1
    baseline = next(t for t in trials if t.user_attrs.get("role") == "baseline")
    share = matmul_share(baseline.user_attrs["arch"], study.user_attrs["nas:identity"]["train"])
    parts = breakdown(trials, workers, ran["started"], ran["ended"], share)
    result = {
        "label": args.label, "trials": args.trials, "workers": workers, "wall_s": round(wall, 1),
        "peak_gflops": {"before": before / 1e9, "after": after / 1e9}, "training_tflop": flops / 1e12,
        "pruned_tflop": pruned / 1e12, "fraction_of_peak": flops / (wall * peak),
        "matmul_share_of_a_step": share, "breakdown_s": {k: round(v, 1) for k, v in parts.items()},
        "breakdown_share": {k: round(v / (wall * workers), 4) for k, v in parts.items()},
        "estimate": estimate_error(ran["lines"], ran["ended"]), "peak_rss_mb": round(ran["peak_rss_mb"], 1),
        "printed_peak_memory": printed_peak_memory(ran["lines"]), "last_line": ran["lines"][-1][1] if ran["lines"]
        else None, "machine": machine_info(os.cpu_count() or 1, "cpu"),
        "made": {"date": dt.date.today().isoformat(), "command": " ".join(ran["command"][2:])},
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "last_line")}, indent=1))
    stored = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    stored["runs"].append(result)
    args.out.write_text(json.dumps(stored, indent=1) + "\n")
    print(f"wrote {args.out}: {result['fraction_of_peak']:.3f} of a {peak / 1e9:.0f} GFLOP/s peak over "
          f"{wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
