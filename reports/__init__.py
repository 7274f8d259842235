"""Read a study from its storage and present it: the leaderboard of shapes ranked by their seed-adjusted loss
(``nas.study.records.seed_adjusted_means``), the HTML report, the dashboard note and the export rows."""
