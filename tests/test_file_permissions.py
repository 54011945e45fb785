"""Files geon writes get the permissions of any new file (the process's umask), as
checkpoints do, and are replaced atomically (a temporary file beside them, renamed).
Checkpoints are tested in test_checkpoint.py, the model frontend's JSON files
(MetricsLog, the examples' metadata) with the frontend; these are the writers elsewhere
in geon: the ONNX conformance report (the kernel cache stays private to its user, as
it holds code that geon loads: test_compiled_trust.py)."""

import os
import stat
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")


@pytest.fixture(params=[0o022, 0o027, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _no_temporaries(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


def test_the_onnx_conformance_report_follows_the_umask(tmp_path, umask):
    from geon.frontends.onnx import conformance
    path = tmp_path / "table.json"
    path.write_text("old")
    os.chmod(path, 0o600)   # replaced, not rewritten in place: the new file's mode
    conformance._write(str(path), '{"Add": ["passed"]}\n')
    assert path.read_text() == '{"Add": ["passed"]}\n'
    assert _mode(path) == 0o666 & ~umask
    assert _no_temporaries(tmp_path)


def test_the_onnx_conformance_report_leaves_no_temporary_file_on_failure(tmp_path,
                                                                          monkeypatch):
    from geon.frontends.onnx import conformance

    def fail(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        conformance._write(str(tmp_path / "t.rst"), "text")
    assert list(tmp_path.iterdir()) == []

