"""The model card (``README.md``) of an exported model directory: its shape, where it came from, its weights.

Where it came from is a ``Provenance``: the study row it was picked from (a ``nas export`` JSON row:
rank, proxy scores and intervals) and/or the run whose checkpoint gave the weights. A card never
claims more than these say: weights from no checkpoint are called freshly initialised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nas.arch import ArchConfig, format_plateaus


@dataclass(frozen=True)
class Provenance:
    """What the card states about the model's origin."""

    row: dict[str, Any] | None = None  # the study row (``reports.export.export_rows``) of its shape
    run: dict[str, Any] | None = None  # the checkpoint: path, step, steps, tokens, val_loss (``nas.hf.run``)
    data: str | None = None  # the tokens it was searched or trained on (``--data``), when known
    seed: int = 0  # the initialisation's seed when the weights are fresh


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:+.2f} %"


def _interval(low: Any, high: Any) -> str:
    return "" if low is None or high is None else f" [{low:+.2f}, {high:+.2f}]"


def study_lines(row: dict[str, Any]) -> list[str]:
    """What the study says about the row's shape: rank, proxy score and its intervals."""
    seeds = row.get("seeds")
    lines = [f"- study `{row.get('study')}` (space {row.get('space')}, proxy preset {row.get('preset')}): "
             f"rank {row.get('rank')}" + (" (the baseline)" if row.get("is_baseline") else "")
             + (", tied with the best" if row.get("tied_with_best") else "")]
    if row.get("adjusted_loss") is not None:
        lines.append(f"- proxy score (seed-adjusted validation loss, the rank): {row['adjusted_loss']:.4f}")
    if row.get("mean_loss") is not None:
        ci = f" ± {row['ci95']:.4f} (95 % interval)" if row.get("ci95") is not None else ""
        lines.append(f"- mean proxy loss over {seeds} seed{'s' if seeds != 1 else ''}: {row['mean_loss']:.4f}{ci}")
    if not row.get("is_baseline") and row.get("expected_gain_pct") is not None:
        interval = _interval(row.get("expected_gain_low"), row.get("expected_gain_high"))
        lines.append(f"- expected gain over the baseline: {_pct(row['expected_gain_pct'])}"
                     + (f"{interval} (95 % posterior)" if interval else " (not shrunk yet: too few seeds)"))
    if not row.get("is_baseline") and row.get("paired_gain_pct") is not None:
        interval = _interval(row.get("paired_gain_low"), row.get("paired_gain_high"))
        lines.append(f"- paired gain over the baseline on {row.get('paired_seeds')} common seeds: "
                     f"{_pct(row['paired_gain_pct'])}" + (f"{interval} (95 % interval)" if interval else ""))
    return lines


def run_lines(run: dict[str, Any]) -> list[str]:
    """What the checkpoint says about the training behind the weights."""
    lines = [f"- trained weights from `{run['path']}`: step {run['step']:,} of {run['steps']:,}, "
             f"{run['tokens']:,} tokens of context {run['seq_len']}"]
    if run.get("val_loss") is not None:
        lines.append(f"- its latest validation loss: {run['val_loss']:.4f} (after {run['val_tokens']:,} tokens)")
    return lines


def model_card(arch: ArchConfig, layout: str, provenance: Provenance) -> str:
    """The README.md of a model directory in ``layout`` (``prism``: remote code; ``llama``: stock)."""
    p = arch.n_params()
    ffn = (f"K={arch.ffn.k} stacked residual SwiGLU sub-MLPs of hidden size {arch.ffn.hidden} (Hourglass)"
           if arch.ffn.k > 1 else f"one SwiGLU of hidden size {arch.ffn.hidden}")
    if arch.ffn.wider:
        ffn += f"; the first {arch.ffn.wider} sub-MLPs have {arch.ffn.hidden + 1}"
    load = ('AutoModelForCausalLM.from_pretrained("DIR", trust_remote_code=True)' if layout == "prism"
            else 'AutoModelForCausalLM.from_pretrained("DIR")  # a stock LlamaForCausalLM')
    code = ("`configuration_prism.py` and `modeling_prism.py` (torch and transformers >= 4.46 only) hold the model: "
            "load it with `trust_remote_code=True`." if layout == "prism"
            else "A stock `LlamaForCausalLM`: no remote code.")
    if provenance.run is not None:
        weights = run_lines(provenance.run)
    else:
        weights = [f"- **freshly initialised, untrained** (seed {provenance.seed}, prism-nas's initialisation: "
                   "N(0, 0.02), residual projections scaled by 1/sqrt(L (1 + K))): train it in your own stack"]
    origin = study_lines(provenance.row) if provenance.row is not None else [
        "- a `nas train` run, not linked to a study here"]
    tokens = (f"Token ids are those of the data it was {'trained' if provenance.run else 'searched'} on"
              + (f" (`--data {provenance.data}`)" if provenance.data else "")
              + ": prism-nas's text data (`builtin`, files, folders) are byte-level (token = byte value, "
              "0x1C between documents), llm.c / FineWeb `.bin` shards are GPT-2 BPE. No tokenizer is included.")
    lines = [
        "---",
        "library_name: transformers",
        "tags: [prism-nas, causal-lm]",
        "---",
        "",
        f"# {arch.label()}",
        "",
        "A decoder-only Transformer whose shape was searched by prism-nas (Prism head schedules: a head count per "
        "layer; Hourglass FFNs: K stacked residual sub-MLPs). " + code,
        "",
        "## Shape",
        "",
        f"- {arch.n_layers} layers, width {arch.d_model}, vocabulary {arch.vocab_size:,}, "
        f"{'tied' if arch.tie_embeddings else 'untied'} input and output embeddings",
        f"- attention heads per layer: {', '.join(map(str, arch.heads))} (plateaus {format_plateaus(arch.heads)}; "
        f"head sizes {', '.join(map(str, arch.head_dims()))})",
        *([f"- key/value heads per layer (grouped-query attention): {', '.join(map(str, arch.kv_heads))} "
           f"(each shared by {', '.join(map(str, arch.kv_groups()))} query heads); KV cache "
           f"{arch.kv_cache_bytes_per_token():,} bytes per token at 16 bits"] if arch.grouped else []),
        f"- FFN: {ffn}",
        f"- RMSNorm (eps {arch.norm_eps:g}) before every attention and every sub-MLP; RoPE base {arch.rope_theta:g}",
        f"- {p['total']:,} parameters ({p['non_embedding']:,} without the embeddings)",
        "",
        "## Where it came from",
        "",
        *origin,
        "",
        "## Weights",
        "",
        *weights,
        "",
        tokens,
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        f"model = {load}",
        "```",
        "",
        "The prism-nas shape (`nas train --config`):",
        "",
        "```json",
        json.dumps(arch.to_dict(), sort_keys=True),
        "```",
        "",
    ]
    return "\n".join(lines)
