"""Ratio benchmarks for prism-nas: every figure is measured against a reference in the same process run.

``python -m benchmarks`` runs every figure and writes ``benchmarks.md`` and
``benchmarks.json``; ``--smoke`` runs each for a few steps (CI proves the harness works; its
numbers mean nothing). One module per figure, ``benchmarks.harness`` for what they share.

| # | module | figure |
|---|---|---|
| 1 | ``prism_free`` | Prism schedules' training tokens/s vs the uniform baseline |
| 2 | ``vs_hf`` | our model vs HF ``LlamaForCausalLM`` at equal shape |
| 3 | ``hourglass_cost`` | K = 2, 4, 8 hourglass FFNs vs the conventional FFN at equal budget |
| 4 | ``efficiency`` | training FLOP/s over the measured matmul peak |
| 5 | ``overhead`` | per-trial fixed cost of a search as a share of a default trial |
| 6 | ``search_efficiency`` | tokens TPE + pruning + de-dup spend to find the best shape vs random |
| 7 | ``space_scaling`` | time to count and enumerate the prism space as L grows |
| 8 | ``report_speed`` | ``nas report`` on 200 and 1,000 trials, and the page's size |
| 9 | ``proposals`` | how often the sampler proposes the baseline or a shape again |
| 10 | ``ranking_simulation`` | known truth: picking the best shape, fixed replicates vs racing |
| 11 | ``proxy_noise`` | seed and paired noise, pruning, quieter proxies (real training, ~30 min: run by name) |
| 12 | ``proxy_fidelity`` | which proxy and score rank Prism schedules against the reference panel (~40 min) |
| 13 | ``gqa_speed`` | grouped-query attention members' tokens/s vs multi-head, their KV cache, the CPU kernel paths |
"""

FIGURES = ("prism_free", "vs_hf", "hourglass_cost", "efficiency", "overhead", "search_efficiency", "space_scaling",
           "report_speed", "proposals", "ranking_simulation", "proxy_noise", "proxy_fidelity", "gqa_speed")
LONG = ("proxy_noise", "proxy_fidelity")  # not in a plain `nas bench`: ask for it with --only
