"""Read a study from its storage and present it: the leaderboard of shapes ranked by their mean over seeds."""
