"""What a measurement ran on (CPU model, threads, versions, accelerator), recorded beside every figure the
benchmark and the study write. Below both, so neither imports the other for it."""

from __future__ import annotations

import os
import platform

import torch

__all__ = ["machine_info"]


def machine_info(device: torch.device) -> dict[str, object]:
    """What the numbers were measured on: CPU model, threads, versions, accelerator."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    info: dict[str, object] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info
