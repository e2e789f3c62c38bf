"""``results.json``: the one versioned record every kind of study writes, and reads back (older records through
a converter)."""
