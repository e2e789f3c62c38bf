"""The stability study: ``python -m bhyt_pl study`` (also ``python -m bhyt_pl.study``); see docs/depth_study.md.

Modules: ``runner`` (one run: a Lightning fit with divergence detection and depth statistics),
``sweep`` (the run lists of the depth study and the stability sweep), ``report`` (tables, figures),
``command`` (argument parsing and the study loop).
"""

from bhyt_pl.study.command import main

__all__ = ["main"]
