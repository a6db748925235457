"""``marlkit study``: algorithms x envs x seeds as ordinary benchmark runs, run side by side and
resumably, reported with rliable's statistics (docs/studies.md)."""
