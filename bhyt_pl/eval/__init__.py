"""Evaluation: the lm-evaluation-harness adapter (``BHyTLM``, registered as lm-eval model ``bhyt_pl``),
sliding-window perplexity, the embedded offline suite, and ``python -m bhyt_pl eval`` (``main``).

Importing this package registers ``bhyt_pl`` with lm-eval's model registry.
"""

from bhyt_pl.data.chat import render_chat
from bhyt_pl.eval.command import PAPER_TASKS, main
from bhyt_pl.eval.lm import BHyTLM
from bhyt_pl.eval.perplexity import PerplexityResult, load_texts, perplexity, sliding_windows
from bhyt_pl.eval.scoring import score_rows

__all__ = [
    "PAPER_TASKS",
    "BHyTLM",
    "PerplexityResult",
    "load_texts",
    "main",
    "perplexity",
    "render_chat",
    "score_rows",
    "sliding_windows",
]
