"""hosts/atomic_write.py: the one atomic replace that LocalHost.write_bytes and the fleet's state
records share: the whole new file with its exact mode, or the old one and no temporary left."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from servefleet.hosts.atomic_write import write_atomically


def test_the_file_is_replaced_whole_with_its_exact_mode(tmp_path: Path) -> None:
    path, tmp = tmp_path / "f", tmp_path / "f.tmp"
    path.write_bytes(b"old" * 1000)
    write_atomically(str(path), b"new", 0o640, str(tmp))  # 0o640: set as given, whatever the umask
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o640 and not tmp.exists()


def test_a_failed_replace_keeps_the_old_and_leaves_no_temporary(tmp_path: Path) -> None:
    target, tmp = tmp_path / "taken", tmp_path / "taken.tmp"
    target.mkdir()
    (target / "inside").write_text("keep")  # a file cannot replace a folder that holds something
    with pytest.raises(OSError):
        write_atomically(str(target), b"new", 0o600, str(tmp))
    assert not tmp.exists() and (target / "inside").read_text() == "keep"
