"""Full-scale re-runs (``nas rerun``): plan which shapes and seeds, carry them to the target, launch, record."""
