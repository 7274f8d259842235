"""The winner leaves the tool: a shape (and its trained weights) as a Hugging Face ``transformers`` model directory.

- ``mapping``: the project's parameter names and shape in HF's (the Prism remote-code layout, and
  stock ``LlamaForCausalLM`` for the shapes LLaMA can express); also what ``benchmarks/vs_hf.py``
  and the model tests compare with;
- ``remote/``: ``configuration_prism.py`` and ``modeling_prism.py``, copied into every ``--format hf``
  directory (package data; they import torch and transformers only, never this package);
- ``run``: the weights of a ``nas train --out`` / ``nas rerun`` checkpoint and the shape they train;
- ``card``: the model card (shape, study row, proxy score and intervals, weights);
- ``export``: writes the directory (temporary folder, then one rename).

Importing this package imports nothing heavy; ``export`` and ``run`` import torch.
"""
