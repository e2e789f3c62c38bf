"""The settings of each submitit executor (``bhyt_pl.study.launch.cluster_settings``): each holds only the fields its
executor applies, rejects the others by name, checks every field at once, and becomes submitit's parameters."""

from __future__ import annotations

import pytest

from bhyt_pl.study.launch.cluster_settings import ClusterSettings, LocalSettings, SlurmSettings


@pytest.mark.parametrize("name", ["partition", "account", "qos", "mem_gb", "additional_parameters", "setup"])
def test_the_local_settings_reject_what_only_slurm_applies_naming_the_field(name: str) -> None:
    with pytest.raises(TypeError, match=name):
        LocalSettings(**{name: "x"})
    assert name in {f for f in SlurmSettings.__dataclass_fields__}


def test_both_executors_check_the_shared_fields_at_once() -> None:
    for settings_class in (LocalSettings, SlurmSettings):
        with pytest.raises(ValueError, match="invalid cluster settings") as error:
            settings_class(timeout_min=0, cpus_per_task=0, retries=-1, lost_after_s=0)
        for part in (
            "timeout_min must be an integer >= 1, got 0",
            "cpus_per_task must be an integer >= 1, got 0",
            "retries must be an integer >= 0, got -1",
            "lost_after_s must be a number of seconds > 0",
        ):
            assert part in str(error.value)
    with pytest.raises(ValueError, match=r"mem_gb must be a number > 0 or None, got -2"):
        SlurmSettings(mem_gb=-2)
    with pytest.raises(ValueError, match=r"partition must be a non-empty name or None, got ' '"):
        SlurmSettings(partition=" ")


def test_from_values_keeps_the_executors_fields_and_names_the_others_it_was_given() -> None:
    values = {"timeout_min": 30, "partition": "gpu", "mem_gb": None, "setup": (), "additional_parameters": {"x": "1"}}
    local, ignored = LocalSettings.from_values(values)
    assert local == LocalSettings(timeout_min=30) and ignored == ["partition", "additional_parameters"]
    slurm, ignored = SlurmSettings.from_values(values)
    assert slurm == SlurmSettings(timeout_min=30, partition="gpu", additional_parameters={"x": "1"}) and ignored == []


def test_executor_parameters_follow_submitits_names() -> None:
    shared = {"name": "s", "timeout_min": 5, "nodes": 1, "tasks_per_node": 1, "cpus_per_task": 2}
    assert LocalSettings(timeout_min=5, cpus_per_task=2).executor_parameters("s") == shared
    assert LocalSettings(timeout_min=5, cpus_per_task=2, gpus_per_node=1).executor_parameters("s") == {
        **shared,
        "gpus_per_node": 1,
    }
    slurm = SlurmSettings(
        timeout_min=5, cpus_per_task=2, partition="gpu", qos="high", mem_gb=8, additional_parameters={"a": True},
        setup=["module load x"], signal_delay_s=60,
    )  # fmt: skip
    assert slurm.executor_parameters("s") == {
        **shared,
        "slurm_partition": "gpu",
        "slurm_qos": "high",
        "mem_gb": 8,
        "slurm_additional_parameters": {"a": True},
        "slurm_setup": ["module load x"],
        "slurm_signal_delay_s": 60,
    }
    assert (LocalSettings.executor, SlurmSettings.executor, ClusterSettings.executor) == ("local", "slurm", "")
