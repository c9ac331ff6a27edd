"""tests/parquet_read.py, the tests' Parquet reader, starts no Arrow thread (apache/arrow#34314: pool
threads alive at exit can abort the pytest process after every test passed)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from conftest import PYTHON

TESTS = Path(__file__).resolve().parent


def test_reading_files_folders_and_bytes_starts_no_arrow_thread(tmp_path: Path) -> None:
    # written by another interpreter: the reading one must not have Arrow's pools already started
    subprocess.run([PYTHON, "-c", textwrap.dedent(f"""
        import pyarrow as pa, pyarrow.parquet as pq
        pq.write_table(pa.table({{"id": ["a", "b"], "n": [1, 2]}}), {str(tmp_path / "part-0.parquet")!r})
        pq.write_table(pa.table({{"id": ["c"], "n": [3]}}), {str(tmp_path / "part-1.parquet")!r})
        """)], check=True, timeout=120)
    (tmp_path / "part-0.json").write_text("{}")  # a sidecar: not Parquet, not read
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        sys.path.insert(0, {str(TESTS)!r})
        from parquet_read import read_parquet
        threads = lambda: len(os.listdir("/proc/self/task"))
        before = threads()
        folder = Path({str(tmp_path)!r})
        assert read_parquet(folder).column("id").to_pylist() == ["a", "b", "c"]
        assert read_parquet(folder / "part-1.parquet", columns=["n"]).to_pylist() == [{{"n": 3}}]
        assert read_parquet((folder / "part-0.parquet").read_bytes(), columns=["id"]).num_rows == 2
        print(threads() - before)
        """)
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == 0, done.stdout
