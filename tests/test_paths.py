"""Default locations, filesystem detection and private directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuq.errors import StateError
from gpuq.paths import (
    check_private_dir,
    default_config_path,
    default_runtime_dir,
    default_state_dir,
    ensure_private_dir,
    filesystem_type,
    is_network_filesystem,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_default_config_path_uses_xdg_config_home(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert default_config_path(environ) == tmp_path / "gpuq" / "config.toml"


@pytest.mark.parametrize("value", [None, "", "relative/dir"])
def test_default_config_path_falls_back_to_home(home: Path, value: str | None) -> None:
    environ = {} if value is None else {"XDG_CONFIG_HOME": value}
    assert default_config_path(environ) == home / ".config" / "gpuq" / "config.toml"


def test_default_config_path_reads_the_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_config_path() == tmp_path / "gpuq" / "config.toml"


def test_default_state_dir(tmp_path: Path, home: Path) -> None:
    assert default_state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "gpuq"
    assert default_state_dir({}) == home / ".local" / "state" / "gpuq"


def test_default_runtime_dir_uses_an_existing_xdg_runtime_dir(tmp_path: Path) -> None:
    assert default_runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "gpuq"


@pytest.mark.parametrize("value", [None, "", "does-not-exist", "/nonexistent/run/user/1000"])
def test_default_runtime_dir_falls_back_to_tmp(value: str | None) -> None:
    environ = {} if value is None else {"XDG_RUNTIME_DIR": value}
    assert default_runtime_dir(environ) == Path(f"/tmp/gpuq-{os.getuid()}")


MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev 0 0
server:/export/home /home nfs4 rw,relatime,vers=4.2 0 0
/dev/sdb1 /home/alice/scratch xfs rw,relatime 0 0
sshfs#bob@host: /mnt/my\\040files fuse.sshfs rw,nosuid 0 0
/dev/sdc1 /data ext4 rw 0 0
server:/data /data nfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/", "ext4"),
        ("/var/lib/x", "ext4"),
        ("/tmp", "tmpfs"),
        ("/tmp/gpuq-1000/sock", "tmpfs"),
        ("/home/alice/.local/state/gpuq", "nfs4"),
        ("/home/alice/scratch/state", "xfs"),  # the longest mount point wins
        ("/home/alice/scratchpad", "nfs4"),  # whole components only
        ("/homestead", "ext4"),
        ("/mnt/my files/gpuq", "fuse.sshfs"),  # \040 in a mount point is a space
        ("/mnt/my", "ext4"),
        ("/data/x", "nfs"),  # mounted over: the later mount wins
    ],
)
def test_filesystem_type_matches_the_longest_mount_point(path: str, fstype: str) -> None:
    assert filesystem_type(Path(path), MOUNTS) == fstype


def test_filesystem_type_without_a_matching_mount_is_none() -> None:
    assert filesystem_type(Path("/x"), "tmpfs /tmp tmpfs rw 0 0\ngarbage\n") is None


def test_filesystem_type_follows_symlinks(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to("/tmp")
    mounts = f"/dev/sda1 / ext4 rw 0 0\nserver:/x {tmp_path} nfs rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n"
    assert filesystem_type(link / "gpuq", mounts) == "tmpfs"


@pytest.mark.skipif(not Path("/proc/self/mounts").exists(), reason="needs Linux /proc")
def test_filesystem_type_reads_proc_mounts() -> None:
    assert filesystem_type(Path("/")) is not None


@pytest.mark.parametrize(
    "fstype",
    ["nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p"]
    + ["fuse.sshfs", "fuse.glusterfs", "fuse.s3fs"],
)
def test_network_filesystems(fstype: str) -> None:
    assert is_network_filesystem(fstype)


@pytest.mark.parametrize(
    "fstype", ["ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "f2fs", "fuseblk", "nfsd"]
)
def test_local_filesystems(fstype: str) -> None:
    assert not is_network_filesystem(fstype)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ensure_private_dir_creates_parents_with_mode_0700(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "gpuq"
    ensure_private_dir(target)
    assert target.is_dir()
    assert mode_of(target) == 0o700


def test_ensure_private_dir_ignores_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        ensure_private_dir(tmp_path / "gpuq")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "gpuq") == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o707, 0o700])
def test_ensure_private_dir_tightens_an_existing_directory(tmp_path: Path, mode: int) -> None:
    target = tmp_path / "gpuq"
    target.mkdir()
    target.chmod(mode)
    ensure_private_dir(target)
    assert mode_of(target) == 0o700


def test_ensure_private_dir_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "gpuq"
    target.write_text("not a directory")
    with pytest.raises(StateError, match="is not a directory") as info:
        ensure_private_dir(target)
    assert info.value.hint is not None


def test_ensure_private_dir_refuses_a_path_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StateError, match="cannot create directory"):
        ensure_private_dir(tmp_path / "file" / "gpuq")


def test_ensure_private_dir_refuses_a_directory_of_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "gpuq"
    target.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: target.stat().st_uid + 1)
    with pytest.raises(StateError, match="belongs to uid") as info:
        ensure_private_dir(target)
    assert info.value.hint is not None and "another user" in info.value.hint


def test_ensure_private_dir_refuses_a_symlink_and_leaves_its_target_alone(tmp_path: Path) -> None:
    target = tmp_path / "someone-elses"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    link = tmp_path / "gpuq"
    link.symlink_to(target)
    with pytest.raises(StateError, match="is a symbolic link") as info:
        ensure_private_dir(link)
    assert info.value.hint is not None and "rm " in info.value.hint
    assert mode_of(target) == 0o755


def test_check_private_dir_refuses_what_others_may_use_without_changing_it(
    tmp_path: Path,
) -> None:
    target = tmp_path / "gpuq"
    target.mkdir()
    target.chmod(0o777)
    with pytest.raises(StateError, match="has mode 777") as info:
        check_private_dir(target)
    assert info.value.hint == f"chmod 700 {target} (gpuq makes its directories 0700)"
    assert mode_of(target) == 0o777


def test_check_private_dir_accepts_a_private_directory(tmp_path: Path) -> None:
    target = tmp_path / "gpuq"
    target.mkdir(mode=0o700)
    check_private_dir(target)


def test_check_private_dir_refuses_a_directory_of_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "gpuq"
    target.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: target.stat().st_uid + 1)
    with pytest.raises(StateError, match="belongs to uid") as info:
        check_private_dir(target)
    assert info.value.hint is not None and "XDG_RUNTIME_DIR" in info.value.hint
