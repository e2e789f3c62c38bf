"""Where runs execute: the ``Launcher`` protocol, the in-process, process-pool and submitit launchers, and the
``Scheduler`` that hands a study's runs to one and reuses the finished ones."""
