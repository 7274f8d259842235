"""The Prism rules on a GPU: the reference panel's 13 schedules at a width and a budget no CPU reaches, and their fit.

    python -m benchmarks.gpu_rules                  # on a GPU: ~7 min; writes benchmarks/data/gpu_rules-<gpu>.json
    python -m benchmarks.gpu_rules --smoke          # tiny shapes on the CPU: checks the script itself (~1 min)

The CPU's rule-fidelity table (``benchmarks/rule_fidelity.py``) reads the Prism rules at 32k-262k tokens on width 96,
where the first layer's head count resolves at the proxy and not at the panel. This panel asks the same at a larger
width and many more tokens: the baseline and the reference panel's 12 schedules (``benchmarks.reference_panel.PANEL``,
the head counts of 12 layers with 12 baseline heads) at ``--width`` (head dims ``width / h``), ``--tokens`` per run
(tens of millions: several passes over the built-in text, the only data a machine without a network has), bf16, on
``--seeds`` common seeds, ``--processes`` runs at a time on the one GPU (small models leave it idle between kernels).
Runs are written to the JSON as they finish; no run starts after ``--budget-s``, and one still under way
``--grace-s`` later is cut off and left out, never half-counted. The Prism rules (``search_spaces.prism.PRISM_RULES``'
defaults) are fitted by the rule model (``nas.stats.rules``) to whatever finished; ``python -m
benchmarks.rule_fidelity`` has the same rules on the CPU's panel and proxies.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.reference_panel import PANEL, SMOKE_PANEL, parse_schedule

DATA = Path(__file__).parent / "data"


def panel(width: int, smoke: bool) -> list[Any]:
    """The baseline and the panel's schedules at ``width`` (12 layers, 12 baseline heads; tiny for ``--smoke``)."""
    from nas.arch import FFNShape, llama_ffn_hidden, uniform

    if smoke:
        base = uniform(4, 32, 4, 256)
        return [base] + [base.replace(heads=list(parse_schedule(s))) for s in SMOKE_PANEL]
    base = uniform(12, width, 12, 256, FFNShape(1, llama_ffn_hidden(width)))
    return [base] + [base.replace(heads=list(parse_schedule(s))) for s in PANEL]


def train_config(args: argparse.Namespace, device: str) -> Any:
    from runners.config import TrainConfig

    if args.smoke:
        return TrainConfig(tokens=2_048, batch_size=4, seq_len=32, lr=1e-2, eval_every=1_024, eval_tokens=512,
                           attention_batches=1, device="cpu", threads=1)
    return TrainConfig(tokens=args.tokens, batch_size=args.batch, seq_len=args.seq_len, lr=args.lr, warmup_frac=0.05,
                       eval_every=args.tokens // 4, eval_tokens=262_144, attention_batches=1, device=device,
                       dtype="bf16", compile=args.compile)


def _train_one(job: tuple[dict, dict, int]) -> dict[str, Any]:
    from nas.arch import ArchConfig
    from nas.data import load_data
    from runners.config import TrainConfig
    from runners.proxy import run

    arch_dict, train_dict, seed = job
    arch, cfg = ArchConfig.from_dict(arch_dict), TrainConfig.from_dict(train_dict).with_(seed=seed)
    result = run(arch, cfg, load_data("builtin"))
    return {"key": arch.key(), "label": arch.label(), "heads": list(arch.heads), "seed": seed,
            "status": result.status, "val_loss": result.val_loss, "tokens_per_s": result.tokens_per_s,
            "wall_time_s": result.wall_time_s, "eval_curve": [list(p) for p in result.eval_curve]}


def rules_of(runs: list[dict[str, Any]], shapes: list[Any]) -> dict[str, Any] | None:
    """The Prism rules fitted to the finished runs (``nas.stats.rules``), as ``nas rules --format json`` gives them."""
    from benchmarks.rule_fidelity import scores_of
    from nas.stats.rules import fit_rules
    from reports.rule_text import fit_json
    from search_spaces.catalog import choose_rules, rule_catalog

    rules = choose_rules(rule_catalog("prism"), None)
    baseline = shapes[0]
    covariates = {a.key(): tuple(rule.value(a, baseline) for rule in rules) for a in shapes}
    scores = scores_of(runs)
    base = scores.get(baseline.key())
    fit = fit_rules(scores, covariates, tuple(rule.name for rule in rules), base.mean if base else None,
                    {rule.name: rule.square_of for rule in rules if rule.square_of})
    return fit_json(fit, rules) if fit is not None else None


def device_name(smoke: bool) -> tuple[str, str]:
    """(torch device, file-name slug of the GPU): ``("cuda", "nvidia-h100-80gb-hbm3")``."""
    import torch

    if smoke or not torch.cuda.is_available():
        return "cpu", "cpu-smoke"
    return "cuda", re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_rules", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script")
    parser.add_argument("--width", type=int, default=384, help="d_model (every panel head count divides 384)")
    parser.add_argument("--tokens", type=int, default=12_000_000, help="training tokens per run")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--processes", type=int, default=4, help="runs at a time on the one GPU")
    parser.add_argument("--compile", action="store_true", help="torch.compile each run (a cold compile a schedule)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no run after this many seconds")
    parser.add_argument("--grace-s", type=float, default=90.0, help="then wait this long for the runs under way")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device, slug = device_name(args.smoke)
    if device == "cpu" and not args.smoke:
        print("error: no GPU here: run it where one is, or give --smoke to check the script on the CPU",
              file=sys.stderr)
        return 2
    out = args.out or (DATA / f"gpu_rules-{slug}.json" if not args.smoke else Path("gpu_rules-smoke.json"))
    shapes = panel(args.width, args.smoke)
    train = train_config(args, device)
    jobs = [(arch.to_dict(), train.to_dict(), seed) for seed in range(args.seeds) for arch in shapes]
    header = {"what": "benchmarks/gpu_rules.py: the Prism rules on the reference panel's schedules",
              "device": slug, "width": shapes[0].d_model, "train": train.to_dict(), "seeds": args.seeds,
              "processes": args.processes, "budget_s": args.budget_s}
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()

    def save() -> None:
        out.write_text(json.dumps({**header, "wall_time_s": round(time.perf_counter() - started, 1),
                                   "rules": rules_of(runs, shapes), "runs": runs}, indent=1) + "\n")

    context = multiprocessing.get_context("spawn")
    waiting, running = list(jobs), []
    # a fresh process a run on the GPU (each its own CUDA context and compile caches); the smoke's reuse theirs
    with context.Pool(args.processes, maxtasksperchild=None if args.smoke else 1) as pool:
        while waiting or running:
            elapsed = time.perf_counter() - started
            while waiting and len(running) < args.processes and elapsed < args.budget_s:  # no run starts after it
                running.append(pool.apply_async(_train_one, (waiting.pop(0),)))
            if not running:
                break
            for done in [r for r in running if r.ready()]:  # collected as they finish, whatever their order
                running.remove(done)
                run = done.get()
                runs.append(run)
                save()
                print(f"[{len(runs)}/{len(jobs)}] {run['label']} seed {run['seed']}: {run['status']} "
                      f"{run['val_loss']} ({run['tokens_per_s']:,.0f} tok/s)", file=sys.stderr, flush=True)
            if elapsed > args.budget_s + args.grace_s:  # a run still going is cut off and left out, not half-counted
                pool.terminate()
                break
            time.sleep(0.2)
    save()
    fitted = rules_of(runs, shapes)
    for rule in (fitted or {}).get("rules", []):
        print(f"{rule['name']}: {rule['estimate']} {rule['ci95']} {rule['verdict']}", file=sys.stderr)
    print(f"wrote {out} ({len(runs)} of {len(jobs)} runs, {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
