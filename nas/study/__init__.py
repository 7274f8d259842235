"""The Optuna study behind ``nas search``: identity, planning, the worker loop, parallel workers, records, storage."""
