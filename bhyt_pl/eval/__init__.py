"""Evaluation: the lm-evaluation-harness adapter (``BHyTLM``, registered as lm-eval model ``bhyt_pl``),
sliding-window perplexity, the embedded offline suite, and ``python -m bhyt_pl eval`` (``main``).

Importing this package registers ``bhyt_pl`` with lm-eval's model registry. It needs the ``eval`` extra: without
it, importing any part of the evaluation raises one line naming the ``pip install`` to run (``bhyt_pl.optional``).
"""

from bhyt_pl.optional import require

require("eval")  # before the imports below, which load lm-eval

from bhyt_pl.data.chat import render_chat  # noqa: E402
from bhyt_pl.eval.command import PAPER_TASKS, main  # noqa: E402
from bhyt_pl.eval.lm import BHyTLM  # noqa: E402
from bhyt_pl.eval.perplexity import PerplexityResult, load_texts, perplexity, sliding_windows  # noqa: E402
from bhyt_pl.eval.scoring import score_rows  # noqa: E402

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
