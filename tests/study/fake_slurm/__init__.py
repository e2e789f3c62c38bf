"""Test infrastructure for ``bhyt_pl.study.launch.slurm`` (and ``submitit_local``): a fake SLURM on PATH
(``cluster``) and picklable run functions that jobs import (``jobs``); the jobs find this package through
``PYTHONPATH``."""
