"""lm-eval's own command line with the ``bhyt_pl`` model registered (lm-eval has no model plugins).

Everything after the module name goes to lm-eval's CLI unchanged::

    python -m bhyt_pl.eval.harness run --model bhyt_pl \\
        --model_args ckpt_path=runs/tiny-bhyt/version_0/checkpoints/last.ckpt,dtype=float32 \\
        --tasks arc_easy --num_fewshot 3 --batch_size 16 --device cpu
"""

from __future__ import annotations

import bhyt_pl.eval.lm  # noqa: F401  (registers the "bhyt_pl" model)


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
