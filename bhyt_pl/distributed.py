"""The former name of ``bhyt_pl.checkpoint_io``, kept so that saved run configs naming
``bhyt_pl.distributed.AtomicCheckpointIO`` (``trainer.plugins`` in every ``config.yaml`` written before the
rename) and scripts importing from here keep working. New code imports ``bhyt_pl.checkpoint_io``."""

from bhyt_pl.checkpoint_io import AtomicCheckpointIO, consolidate_checkpoint, load_sharded_checkpoint, main

__all__ = ["AtomicCheckpointIO", "consolidate_checkpoint", "load_sharded_checkpoint", "main"]
