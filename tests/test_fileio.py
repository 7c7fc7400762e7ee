"""The shared file helpers (``ablate.fileio``): a streamed sha256 and a whole-file write."""

from __future__ import annotations

import hashlib
import os
import stat

from ablate.fileio import sha256_file, write_atomic


def test_a_files_sha256_is_hashlibs_over_blocks_of_any_size(tmp_path):
    path = tmp_path / "weights.bin"
    data = os.urandom((1 << 20) + 12345)  # more than one block, the last one short
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_a_whole_write_replaces_a_file_private_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "credentials"
    path.write_text("old")
    (tmp_path / ".credentials.tmp").write_text("left by a process that died")
    write_atomic(path, "new ü", 0o600)
    assert path.read_text(encoding="utf-8") == "new ü"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["credentials"]


def test_a_whole_write_replaces_a_planted_symlink_and_never_writes_through_it(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("kept")
    path = tmp_path / "state.json"
    path.symlink_to(target)
    (tmp_path / ".state.json.tmp").symlink_to(target)  # planted at the temporary's name too
    write_atomic(path, "{}")
    assert not path.is_symlink() and path.read_text() == "{}"
    assert target.read_text() == "kept"
