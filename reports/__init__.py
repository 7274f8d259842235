"""Read a study from its storage and present it: the leaderboard of shapes ranked by their shrunk gain over the
baseline (the mixed model's posterior, ``nas.stats.shrinkage``), the HTML report, the dashboard note and the export
rows."""
