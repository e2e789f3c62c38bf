"""The documents and figures of a study, rendered from its record alone."""
