"""A GPU's type is the model its name reports, the same for every variant of it."""

from __future__ import annotations

import pytest

from gpuq.gputypes import gpu_type, matches
from gpuq.models import GpuInfo


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 2080 Ti", "RTX2080Ti"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA GeForce RTX 4070 SUPER", "RTX4070Super"),
        ("Quadro RTX 6000", "RTX6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000Ada"),
        ("NVIDIA RTX A6000", "A6000"),
        ("NVIDIA TITAN RTX", "RTX"),
        ("Fake L4", "L4"),
        ("Fake GPU", "GPU"),
        ("NVIDIA", "NVIDIA"),
        ("", "unknown"),
    ],
)
def test_a_gpus_type_is_its_model_without_vendor_or_form_factor(name: str, expected: str) -> None:
    assert gpu_type(name) == expected


def test_a_type_is_matched_whatever_its_case() -> None:
    assert matches("NVIDIA A100-SXM4-40GB", ("a100", "H100"))
    assert not matches("Tesla T4", ("A100",))


def test_every_gpu_reports_its_type_in_json() -> None:
    gpu = GpuInfo("GPU-1", 0, "NVIDIA A100-SXM4-40GB", 40 << 30, 0, node="gpu2")
    assert gpu.type == "A100"
    data = gpu.to_dict()
    assert data["type"] == "A100"
    assert GpuInfo.from_dict(data).type == "A100"
