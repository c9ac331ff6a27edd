"""Parquet read in-process without Arrow's thread pools (apache/arrow#34314: pool threads alive at exit
can abort the interpreter after its work is done): the tests' reader (tests/parquet_read.py) and the
CLI's small readers start no thread."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from conftest import PYTHON

TESTS = Path(__file__).resolve().parent


def test_reading_files_folders_and_bytes_starts_no_arrow_thread(tmp_path: Path) -> None:
    # written by another interpreter: the reading one must not have Arrow's pools already started
    subprocess.run(
        [
            PYTHON,
            "-c",
            textwrap.dedent(f"""
        import pyarrow as pa, pyarrow.parquet as pq
        pq.write_table(pa.table({{"id": ["a", "b"], "n": [1, 2]}}), {str(tmp_path / "part-0.parquet")!r})
        pq.write_table(pa.table({{"id": ["c"], "n": [3]}}), {str(tmp_path / "part-1.parquet")!r})
        """),
        ],
        check=True,
        timeout=120,
    )
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


def test_the_clis_small_parquet_readers_start_no_arrow_thread(tmp_path: Path) -> None:
    """bench --dataset and plan's output sample read a Parquet file in the CLI's process, which Arrow's
    pool threads can abort at exit as they did plan --check's (test_plan_check)."""
    data = tmp_path / "data.parquet"
    subprocess.run(
        [
            PYTHON,
            "-c",
            textwrap.dedent(f"""
        import pyarrow as pa, pyarrow.parquet as pq
        pq.write_table(pa.table({{"prompt": ["a b", "c d e"], "output_tokens": [10, 30]}}), {str(data)!r})
        """),
        ],
        check=True,
        timeout=120,
    )
    code = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from servefleet.bench.workload import load_dataset
        from servefleet.plan.runs import sample_output_mean
        import pyarrow, pyarrow.parquet
        threads = lambda: len(os.listdir("/proc/self/task"))
        before = threads()
        assert sorted(p.text for p in load_dataset(Path({str(data)!r}), 2, None)) == ["a b", "c d e"]
        assert sample_output_mean(Path({str(data)!r})) == (20.0, 2)
        print(threads() - before)
        """)
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == 0, done.stdout
