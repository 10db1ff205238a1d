"""Simulated clusters: bundled shapes and TOML files of node groups with GPU types."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.errors import UsageError
from gpuq.sim.cluster import load_cluster, uniform_cluster


def test_sias_mixed_cluster_is_64_gpus_of_three_types_in_node_order() -> None:
    cluster = load_cluster("sia")
    assert cluster.tables == "sia"
    assert cluster.total_gpus == 64
    assert cluster.gpu_types == ("T4", "RTX2080Ti", "A100")
    assert cluster.mixed
    assert [n.name for n in cluster.nodes[:2]] == ["t40", "t41"]
    assert [(n.name, n.gpus, n.gpu_type) for n in cluster.nodes[-2:]] == [
        ("a1000", 8, "A100"),
        ("a1001", 8, "A100"),
    ]
    assert cluster.describe() == "6x4 T4 + 3x8 RTX2080Ti + 2x8 A100 (64 GPUs, sia tables)"


def test_the_default_cluster_is_pollux_16_nodes_of_4_t4() -> None:
    assert load_cluster("pollux") == uniform_cluster(16, 4)
    assert not uniform_cluster(16, 4).mixed


def test_a_toml_file_lists_node_groups_with_types_any_case(tmp_path: Path) -> None:
    path = tmp_path / "lab.toml"
    path.write_text(
        '[[nodes]]\ntype = "a100"\ngpus = 8\nname = "dgx"\n\n'
        '[[nodes]]\ntype = "T4"\ngpus = 4\ncount = 2\n'
    )
    cluster = load_cluster(str(path))
    assert [(n.name, n.gpus, n.gpu_type) for n in cluster.nodes] == [
        ("dgx0", 8, "A100"),
        ("t40", 4, "T4"),
        ("t41", 4, "T4"),
    ]
    assert cluster.tables == "sia"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[nodes]]\ntype = "H100"\ngpus = 8\n', "GPU type 'H100' has no sia tables; known: T4"),
        ('tables = "pollux"\n[[nodes]]\ntype = "A100"\ngpus = 8\n', "no pollux tables"),
        ('[[nodes]]\ntype = "T4"\ngpus = 0\n', "gpus must be a whole number from 1 to 4096"),
        ('[[nodes]]\ntype = "T4"\ngpus = 4\ncount = true\n', "count must be a whole number"),
        ('[[nodes]]\ntype = "T4"\ngpus = 4\nspeed = 2\n', "unknown key 'speed'"),
        ('tables = "gavel"\n[[nodes]]\ntype = "T4"\ngpus = 4\n', "unknown tables 'gavel'"),
        ("nodes = []\n", "no [[nodes]]"),
        ("[[nodes]\n", "is not valid TOML"),
        ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        (
            '[[nodes]]\ntype = "T4"\ngpus = 4\nname = "a"\n[[nodes]]\ntype = "A100"\ngpus = 8\n'
            'name = "a"\n',
            "",
        ),
    ],
)
def test_a_bad_cluster_file_is_refused_with_what_is_wrong(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    if not message:  # two groups may share a prefix: numbering goes on
        names = [n.name for n in load_cluster(str(path)).nodes]
        assert names == ["a0", "a1"]
        return
    with pytest.raises(UsageError, match=message.replace("[", r"\[")):
        load_cluster(str(path))


def test_an_unknown_cluster_name_lists_the_bundled_ones() -> None:
    with pytest.raises(UsageError) as error:
        load_cluster("nope")
    assert "no cluster file or bundled cluster 'nope'" in str(error.value)
    assert "pollux, sia, sia-t4, phoebe" in (error.value.hint or "")
