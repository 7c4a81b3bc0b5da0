"""The worker daemon: unchanged zip archives are not re-read at every Python task, deltalake is never loaded, and
what it loaded is frozen before it forks workers."""

from __future__ import annotations

import json
import os
import zipfile
import zipimport
from pathlib import Path

import pytest

from ticdc_delta.spark.worker_daemon import keep_unchanged_zip_directories


def _archive(path: Path, modules: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in modules.items():
            zf.writestr(f"{name}.py", text)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The archives whose directory zipimport reads (its module-level reader, counted)."""
    seen: list[str] = []
    real = zipimport._read_directory  # type: ignore[attr-defined]

    def counting(archive: str) -> object:
        seen.append(archive)
        return real(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counting)
    return seen


def test_an_unchanged_archive_is_read_once_and_a_changed_one_again(tmp_path: Path, reads: list[str]) -> None:
    path = tmp_path / "lib.zip"
    _archive(path, {"first_mod": "X = 1\n"})
    importer = zipimport.zipimporter(str(path))
    restore = keep_unchanged_zip_directories()
    try:
        reads.clear()
        importer.invalidate_caches()  # not read since the patch: read now
        importer.invalidate_caches()
        importer.invalidate_caches()
        assert reads == [str(path)]
        assert importer.find_spec("second_mod") is None

        _archive(path, {"first_mod": "X = 1\n", "second_mod": "Y = 2\n"})  # replaced: another size
        os.utime(path, ns=(1, 1))  # and another mtime
        importer.invalidate_caches()
        assert reads == [str(path), str(path)]
        assert importer.find_spec("second_mod") is not None  # the new directory is the one used
    finally:
        restore()


def test_restore_puts_the_original_back(tmp_path: Path, reads: list[str]) -> None:
    path = tmp_path / "lib.zip"
    _archive(path, {"m": ""})
    importer = zipimport.zipimporter(str(path))
    keep_unchanged_zip_directories()()
    reads.clear()
    importer.invalidate_caches()
    importer.invalidate_caches()
    assert reads == [str(path), str(path)]  # every call reads again, as CPython does


def test_a_missing_archive_is_not_cached(tmp_path: Path, reads: list[str]) -> None:
    path = tmp_path / "gone.zip"
    _archive(path, {"m": ""})
    importer = zipimport.zipimporter(str(path))
    path.unlink()
    restore = keep_unchanged_zip_directories()
    try:
        reads.clear()
        importer.invalidate_caches()  # no stamp: read (and fail softly, as CPython does)
        importer.invalidate_caches()
        assert reads == [str(path), str(path)]
    finally:
        restore()


def test_the_daemon_does_not_load_deltalake() -> None:
    """Workers are forked from the daemon: deltalake's runtime refuses to run in a process forked after
    deltalake was imported (it starts a thread at import), so the daemon must never import it."""
    import subprocess
    import sys

    code = ("import sys; sys.argv = ['daemon']; import ticdc_delta.spark.worker_daemon; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'deltalake'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_the_daemon_freezes_what_it_loaded_before_it_forks_workers() -> None:
    """pyspark's daemon runs ``gc.collect()`` in a reused worker after every task: the objects the daemon
    loaded (pyarrow, pandas, pyspark, the codecs) are frozen before it starts, so those collections walk
    only what the worker's tasks made (the daemon itself is stopped right where it would start); pyspark's
daemon module is left for runpy to run."""
    import subprocess
    import sys
    from pathlib import Path

    import ticdc_delta.spark.worker_daemon as daemon

    code = ("import gc, json, runpy, sys; sys.argv = ['daemon']; "
            "runpy.run_module = lambda *a, **k: print(json.dumps([gc.get_freeze_count(), len(gc.get_objects()), "
            "'pyspark.worker' in sys.modules, 'pyspark.daemon' in sys.modules])); "
            f"runpy.run_path({str(Path(daemon.__file__))!r}, run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    frozen, walked, worker_loaded, daemon_imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert worker_loaded
    assert not daemon_imported  # runpy runs it as __main__, and warns when it was imported before
    assert frozen > 50_000  # (~110,000 here)
    assert walked < frozen / 20
