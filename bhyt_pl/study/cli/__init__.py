"""The study's command line: the driver every kind of study runs on, and the kinds (exploration, confirmation)."""
