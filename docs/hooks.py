"""MkDocs hook: pages that are generated from the code at build time, so that they cannot go stale.

``<!-- presets-table -->`` in a page becomes the table of ``runners.presets.PRESETS``: each preset's
baseline shape, exact parameter count (``ArchConfig.n_params``) and training budget, and for the GPU
proxy presets the arithmetic ``nas presets`` states.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- presets-table -->"


def presets_table() -> str:
    from nas.cli.tools import gpu_arithmetic
    from runners.presets import PRESETS

    rows = ["| preset | baseline shape | parameters | training | what it is for |", "|---|---|---|---|---|"]
    notes = []
    for p in PRESETS.values():
        b, t = p.baseline, p.train
        rows.append(f"| `{p.name}` | L{b.n_layers} d{b.d_model} h{b.heads[0]}, V{b.vocab_size}, SwiGLU {b.ffn.hidden} "
                    f"| {b.n_params()['total']:,} | {t.tokens:,} tokens, B{t.batch_size} T{t.seq_len}, lr {t.lr:g}, "
                    f"{t.device}/{t.dtype}{', compiled' if t.compile else ''} | {p.description} |")
        if p.gpu is not None:
            notes.append(f"- `{p.name}`: {gpu_arithmetic(p)}.")
    return "\n".join(rows) + "\n\nWhat a GPU proxy's trial costs, as `nas presets` prints it:\n\n" + "\n".join(notes)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return markdown.replace(MARKER, presets_table()) if MARKER in markdown else markdown
