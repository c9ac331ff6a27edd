"""The SGLang recipe for the H200 (benchmarks/gpu/sglang*): its stand-in modules, which decide whether
SGLang starts at all there (a stand-in that answers too much sent sgl_kernel's RMSNorm to a dummy on
the device), and the fleet files its driver writes, read by servefleet's own loader."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from servefleet.fleet.core import Fleet

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
STUBS = GPU / "sglang"


def run_python(code: str, standins: str, extra_path: list[Path] = ()) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "STANDIN_MODULES": standins,
        "PYTHONPATH": os.pathsep.join([str(STUBS), *map(str, extra_path), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )


def test_flashinfer_standin_serves_the_named_submodules_only() -> None:
    """What SGLang imports unguarded on CUDA resolves; what sgl_kernel probes in a try keeps failing."""
    res = run_python(
        """
        import importlib.util
        import flashinfer
        from flashinfer import bmm_fp8                      # quantization/fp8_utils.py
        from flashinfer.sampling import top_k_top_p_sampling_from_probs   # layers/sampler.py
        from flashinfer.prefill import cudnn_batch_prefill_with_kv_cache  # attention/vision.py
        print("version", flashinfer.__version__)
        try:
            import flashinfer.norm                          # sgl_kernel/elementwise.py, in a try
        except ImportError:
            print("norm missing")
        print("spec", importlib.util.find_spec("flashinfer") is not None)
        """,
        "IPython=9.0.0,flashinfer/sampling+prefill=0.6.15.post1",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:3] == ["version 0.6.15.post1", "norm missing", "spec True"]


def test_whole_package_standin_answers_submodules_calls_and_subclassing() -> None:
    res = run_python(
        """
        from IPython.display import HTML, display
        import soundfile
        display(HTML("<b>x</b>"))
        class Sub(soundfile.SoundFile):
            pass
        print(type(Sub()).__name__, bool(soundfile.read("x")), list(soundfile.available_formats()))
        """,
        "IPython=9.0.0,soundfile=0.13.1",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "Sub False []"


def test_unlisted_modules_are_untouched() -> None:
    res = run_python(
        """
        import json
        try:
            import no_such_module_xyz
        except ModuleNotFoundError:
            print("missing")
        try:
            import IPythonX
        except ModuleNotFoundError:
            print("prefix missing")
        """,
        "IPython=9.0.0",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["missing", "prefix", "missing"]


def test_the_next_sitecustomize_on_the_path_still_runs(tmp_path: Path) -> None:
    """The image may have its own sitecustomize; ours goes first on PYTHONPATH and must chain to it."""
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.CHAINED = True\n")
    res = run_python("import builtins; print(getattr(builtins, 'CHAINED', False))", "IPython=9.0.0", [tmp_path])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True"


def test_driver_fleet_files_load_with_servefleet(tmp_path: Path) -> None:
    """The main and failure fleets sglang_h200.sh writes, rendered by its own shell functions."""
    script = (GPU / "sglang_h200.sh").read_text()
    functions = []
    for name in ("fleet_header", "args_line", "server_toml", "fleet_main", "fleet_fail"):
        start = script.index(f"{name}() {{")
        line_end = script.index("\n", start)
        one_line = script[start:line_end].rstrip().endswith("}")
        functions.append(script[start : line_end + 1 if one_line else script.index("\n}\n", start) + 3])
    prelude = textwrap.dedent(f"""
        W={tmp_path}; MODEL=$W/model; NAME=sf-realistic; P=python3; PYTHONPATH=/a:/b; STANDIN_MODULES=IPython=9.0.0
        BASE=(--attention-backend triton --sampling-backend pytorch --context-length 4096 --log-level info)
        """)
    subprocess.run(
        ["bash", "-c", prelude + "\n".join(functions) + "\nfleet_main\nfleet_fail\n"], check=True, timeout=30
    )
    main = Fleet.load(tmp_path / "fleet-main.toml")
    plain, ngram = (main.spec.server(n) for n in ("plain", "ngram"))
    assert plain.engine == ngram.engine == "sglang"
    assert list(ngram.args[:4]) == ["--attention-backend", "triton", "--sampling-backend", "pytorch"]
    assert "NGRAM" in ngram.args and "NGRAM" not in plain.args
    assert plain.env["SGLANG_IS_FLASHINFER_AVAILABLE"] == "false"
    assert list(plain.args) == [
        *("--attention-backend", "triton", "--sampling-backend", "pytorch", "--context-length", "4096"),
        *("--log-level", "info", "--mem-fraction-static", "0.40", "--max-running-requests", "256"),
    ]
    assert (main.spec.name, main.spec.timeout, main.spec.stall, main.spec.smoke) == ("sgmain", 400, 240, True)
    assert main.spec.state_dir == tmp_path / "state" / "main" and tuple(plain.gpus) == tuple(ngram.gpus) == (0,)
    fail = Fleet.load(tmp_path / "fleet-fail.toml")
    assert {s.name for s in fail.spec.servers} == {"lowmem", "missing", "badarg", "sigkill"}
    assert fail.spec.server("missing").model.endswith("no-such-model")
    assert (fail.spec.name, fail.spec.timeout, fail.spec.stall, fail.spec.state_dir) == (
        "sgfail",
        240,
        200,
        tmp_path / "state" / "fail",
    )
    assert list(fail.spec.server("badarg").args[-2:]) == ["--mem-fraction-static", "abc"]


def test_recipe_scripts_parse() -> None:
    for name in ("sglang_prepare.sh", "sglang_setup.sh", "sglang_h200.sh"):
        subprocess.run(["bash", "-n", str(GPU / name)], check=True, timeout=30)
