"""Engine-native arguments servefleet depends on: each profile's flag table (served name, port, host,
tensor-parallel size, max running requests, memory fraction, context length, speculative settings),
the argv that does not repeat a flag the user gave, and the fleet loader's fill-in and conflicts."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servefleet.cli.main import app
from servefleet.engines.base import LaunchSpec
from servefleet.engines.native_args import ArgTable, Flag
from servefleet.engines.registry import engine_names, get_engine
from servefleet.errors import ConfigError, EngineError
from servefleet.fleet.core import Fleet
from servefleet.fleet.loader import parse_fleet

# (engine, command, args, the facts read from them)
TABLE: list[tuple[str, tuple[str, ...], list[str], dict[str, Any]]] = [
    # ---- vLLM: --served-model-name takes several names (the first is reported), -tp, --x=v, --x_y
    (
        "vllm",
        (),
        ["--served-model-name", "tiny", "alias2", "--port", "8001", "--host", "0.0.0.0"],
        {"served_model_name": "tiny", "port": 8001, "host": "0.0.0.0"},
    ),
    (
        "vllm",
        (),
        ["-tp", "2", "--max-num-seqs=256", "--gpu-memory-utilization", "0.85", "--max-model-len", "16k"],
        {"tensor_parallel_size": 2, "max_running_requests": 256, "memory_fraction": 0.85, "context_length": 16000},
    ),
    (
        "vllm",
        (),
        ["--tensor-parallel-size=4", "--max_num_seqs", "8", "--max-model-len=32K"],
        {"tensor_parallel_size": 4, "max_running_requests": 8, "context_length": 32768},
    ),
    (
        "vllm",
        (),
        ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
        {"speculative": {"method": "mtp", "num_speculative_tokens": 1}},
    ),
    (
        "vllm",
        (),
        ["--speculative-model", "/d", "--num-speculative-tokens", "5"],
        {"speculative": {"model": "/d", "num_speculative_tokens": 5}},
    ),
    # the last occurrence wins, like argparse; unrelated flags and their values are skipped
    ("vllm", (), ["--port", "1", "--dtype", "bfloat16", "--port", "2", "--enforce-eager"], {"port": 2}),
    ("vllm", (), ["--served-model-name", "a", "--trust-remote-code"], {"served_model_name": "a"}),
    ("vllm", (), ["--model=/m/x", "--max_model_len", "auto"], {"model": "/m/x", "context_length": None}),
    ("sglang", (), ["--model-path", "/m/q"], {"model": "/m/q"}),
    ("llamacpp", (), ["-m", "/m/t.gguf"], {"model": "/m/t.gguf"}),
    ("llamacpp", ("python3", "-m", "llama_cpp.server"), ["--model", "/m/t.gguf"], {"model": "/m/t.gguf"}),
    ("tgi", (), ["--model-id", "org/m"], {"model": "org/m"}),
    ("sim", (), ["--model-path", "sim-7b"], {"model": "sim-7b"}),
    # ---- SGLang
    (
        "sglang",
        (),
        ["--served-model-name", "q", "--port=30001", "--host", "0.0.0.0", "--tp-size", "2"],
        {"served_model_name": "q", "port": 30001, "host": "0.0.0.0", "tensor_parallel_size": 2},
    ),
    (
        "sglang",
        (),
        ["--tp", "4", "--max-running-requests", "128", "--mem-fraction-static", "0.8", "--context-length", "32768"],
        {"tensor_parallel_size": 4, "max_running_requests": 128, "memory_fraction": 0.8, "context_length": 32768},
    ),
    ("sglang", (), ["--tensor-parallel-size", "8"], {"tensor_parallel_size": 8}),
    (
        "sglang",
        (),
        [
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
            "--speculative-draft-model-path",
            "/d",
        ],
        {
            "speculative": {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
                "speculative_draft_model_path": "/d",
            }
        },
    ),
    # ---- llama.cpp: native llama-server, and llama-cpp-python (snake_case flags) by its command
    (
        "llamacpp",
        (),
        ["-a", "tiny", "--port", "8081", "-np", "4", "-c", "8192", "-ngl", "99"],
        {"served_model_name": "tiny", "port": 8081, "max_running_requests": 4, "context_length": 8192},
    ),
    (
        "llamacpp",
        (),
        ["--alias=t", "--parallel", "2", "--ctx-size=4096", "--host", "0.0.0.0", "-md", "/d.gguf", "--draft-max", "8"],
        {
            "served_model_name": "t",
            "max_running_requests": 2,
            "context_length": 4096,
            "host": "0.0.0.0",
            "speculative": {"draft_model": "/d.gguf", "draft_max": 8},
        },
    ),
    (
        "llamacpp",
        ("python3", "-m", "llama_cpp.server"),
        ["--model_alias", "tiny", "--n_ctx", "2048", "--port", "9"],
        {"served_model_name": "tiny", "context_length": 2048, "port": 9},
    ),
    # llama-cpp-python does not know -a: not read as an alias there
    ("llamacpp", ("python3",), ["-a", "x"], {}),
    # ---- transformers serve: no served-name flag (pinned to its model)
    (
        "transformers",
        (),
        ["--port", "8002", "--host=0.0.0.0", "--device", "cpu", "--cb-max-memory-percent", "0.5"],
        {"port": 8002, "host": "0.0.0.0", "memory_fraction": 0.5},
    ),
    ("transformers", (), ["--served-model-name", "x"], {}),
    # ---- TGI
    (
        "tgi",
        (),
        [
            "-p",
            "3000",
            "--hostname",
            "0.0.0.0",
            "--num-shard",
            "2",
            "--max-concurrent-requests",
            "64",
            "--cuda-memory-fraction",
            "0.9",
            "--max-total-tokens",
            "4096",
            "--speculate",
            "2",
        ],
        {
            "port": 3000,
            "host": "0.0.0.0",
            "tensor_parallel_size": 2,
            "max_running_requests": 64,
            "memory_fraction": 0.9,
            "context_length": 4096,
            "speculative": {"speculate": 2},
        },
    ),
    # ---- the simulator: its own names and the real engines' aliases
    (
        "sim",
        (),
        [
            "--served-model-name",
            "t",
            "--port",
            "7",
            "--max-running",
            "8",
            "--tp-size",
            "2",
            "--max-model-len",
            "4096",
            "--tokens-per-step",
            "3",
            "--speculative-algorithm",
            "NEXTN",
            "--gpu-memory-utilization",
            "0.5",
        ],
        {
            "served_model_name": "t",
            "port": 7,
            "max_running_requests": 8,
            "tensor_parallel_size": 2,
            "context_length": 4096,
            "speculative": {"tokens_per_step": 3, "speculative_algorithm": "NEXTN"},
            "memory_fraction": 0.5,
        },
    ),
    ("sim", (), ["--max-num-seqs=16", "--context-length", "512"], {"max_running_requests": 16, "context_length": 512}),
    # ---- openai: the user's own command is read as well as the args
    (
        "openai",
        ("my-server", "--port", "9000", "--served-model-name", "m"),
        ["--host", "0.0.0.0"],
        {"port": 9000, "served_model_name": "m", "host": "0.0.0.0"},
    ),
]


@pytest.mark.parametrize(
    ("engine", "command", "args", "expected"), TABLE, ids=[f"{row[0]}-{i}" for i, row in enumerate(TABLE)]
)
def test_engine_native_args_are_read(
    engine: str, command: tuple[str, ...], args: list[str], expected: dict[str, Any]
) -> None:
    native = get_engine(engine).native_args(args, command)
    assert dict(native.values) == expected
    assert not native.problems


def test_every_engine_declares_its_flags() -> None:
    # a profile without a table would silently ignore the user's --port / --served-model-name
    for name in engine_names():
        table = get_engine(name).arg_table_for(())
        assert table.names_for("port"), name
        assert table.names_for("host"), name


@pytest.mark.parametrize(
    ("engine", "args", "problem"),
    [
        ("vllm", ["--port", "abc"], "--port 'abc': not a whole number"),
        ("vllm", ["--max-model-len", "lots"], "--max-model-len 'lots': not a whole number"),
        ("vllm", ["--speculative-config", "{method: mtp}"], "--speculative-config '{method: mtp}': not valid JSON"),
        ("vllm", ["--speculative-config", "[1]"], "must be a JSON object"),
        ("sglang", ["--mem-fraction-static", "most"], "--mem-fraction-static 'most': not a number"),
        ("sim", ["--tokens-per-step", "2.5"], "--tokens-per-step '2.5': not a whole number"),
        ("llamacpp", ["--port"], "--port: needs a value"),
        ("vllm", ["--served-model-name", "--port", "1"], "--served-model-name: needs a value"),
    ],
)
def test_values_the_engine_would_reject_are_problems(engine: str, args: list[str], problem: str) -> None:
    native = get_engine(engine).native_args(args)
    assert any(problem in p for p in native.problems.values()), native.problems
    assert not set(native.problems) & set(native.values)  # a rejected value is not a fact


def test_a_bad_value_of_a_fact_servefleet_uses_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"servers\[0\] \"v\": args: --port 'http': not a whole number"):
        fleet(
            """
            [[servers]]
            name = "v"
            engine = "vllm"
            model = "/m"
            args = ["--port", "http"]
        """,
            tmp_path,
        )


def test_other_bad_values_are_left_for_the_engine_to_reject(tmp_path: Path) -> None:
    # vLLM says "argument --max-num-seqs: invalid int value: 'abc'" itself, diagnosed as config_error
    # (tests/test_real_vllm.py); one server's engine error must not stop the whole fleet file
    spec = fleet(
        """
        [[servers]]
        name = "v"
        engine = "vllm"
        model = "/m"
        port = 8000
        args = ["--max-num-seqs", "abc"]
    """,
        tmp_path,
    )
    assert Fleet(spec).resolve()[0].argv[-2:] == ["--max-num-seqs", "abc"]


def test_auto_and_negative_numbers_are_values_not_flags() -> None:
    native = get_engine("vllm").native_args(["--max-model-len", "-1", "--port", "1"])
    assert "context_length" in native and native.get("context_length") is None and native.port == 1
    assert get_engine("vllm").native_args(["--max-model-len", "auto"]).get("context_length") is None


def test_a_table_lists_each_flag_once_and_knows_its_fields() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        ArgTable(Flag(("--port",), "port"), Flag(("--port",), "host"))
    with pytest.raises(ValueError, match="unknown native field"):
        Flag(("--x",), "colour")


# ---- the served name and the argv ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("engine", "command", "args", "name"),
    [
        ("vllm", (), ["--served-model-name", "tiny", "t2"], "tiny"),
        ("sglang", (), ["--served-model-name=q"], "q"),
        ("llamacpp", (), ["-a", "tiny"], "tiny"),
        ("llamacpp", ("python3", "-m", "llama_cpp.server"), ["--model_alias", "tiny"], "tiny"),
        ("sim", (), ["--served-model-name", "s"], "s"),
        ("openai", ("srv", "--served-model-name", "o"), [], "o"),
        ("transformers", (), ["--device", "cpu"], "/m"),  # pinned to its model
        ("tgi", (), ["--served-model-name", "g"], "g"),
    ],
)
def test_the_served_name_comes_from_the_args(
    engine: str, command: tuple[str, ...], args: list[str], name: str
) -> None:
    spec = LaunchSpec(model="/m", port=1, extra_args=tuple(args), command=command)
    assert get_engine(engine).served_name(spec) == name


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp", "tgi", "sim", "transformers"])
def test_flags_given_in_args_are_not_added_again(engine: str) -> None:
    profile = get_engine(engine)
    table = profile.arg_table_for(())
    port_flag, host_flag = table.names_for("port")[-1], table.names_for("host")[-1]
    extra = (f"{port_flag}=8123", host_flag, "0.0.0.0")
    argv = profile.build_argv(LaunchSpec(model="/m", port=8123, host="0.0.0.0", extra_args=extra))
    assert argv[-3:] == list(extra)
    assert sum(a == port_flag or a.startswith(port_flag + "=") for a in argv) == 1
    assert argv.count(host_flag) == 1


@pytest.mark.parametrize(("engine", "tp_flag"), [("vllm", "-tp"), ("sglang", "--tp"), ("tgi", "--num-shard")])
def test_a_tensor_parallel_flag_in_args_replaces_the_one_from_gpus(engine: str, tp_flag: str) -> None:
    argv = get_engine(engine).build_argv(LaunchSpec(model="/m", port=1, gpus=(0, 1, 2, 3), extra_args=(tp_flag, "2")))
    names = get_engine(engine).arg_table_for(()).names_for("tensor_parallel_size")
    assert [a for a in argv if a in names] == [tp_flag]


def test_a_served_name_in_the_args_is_not_added_again() -> None:
    argv = get_engine("vllm").build_argv(
        LaunchSpec(model="/m", port=1, served_model_name="tiny", extra_args=("--served-model-name", "tiny", "t2"))
    )
    assert argv.count("--served-model-name") == 1 and argv[-3:] == ["--served-model-name", "tiny", "t2"]


def test_a_spec_that_disagrees_with_its_args_is_an_engine_error() -> None:
    # the loader reports this first (naming the fleet file's field); the profile refuses it too
    with pytest.raises(
        EngineError, match="'--served-model-name other' in args disagrees with served_model_name 'tiny'"
    ):
        get_engine("vllm").build_argv(
            LaunchSpec(model="/m", port=1, served_model_name="tiny", extra_args=("--served-model-name", "other"))
        )
    with pytest.raises(EngineError, match="'--port 9001' in args disagrees with port 9000"):
        get_engine("openai").build_argv(LaunchSpec(model="", port=9000, command=("srv", "--port", "9001")))


# ---- the fleet file -----------------------------------------------------------------------------
def fleet(text: str, tmp_path: Path) -> Any:
    import tomllib

    return parse_fleet(tomllib.loads(textwrap.dedent(text)), tmp_path / "fleet.toml")


def test_the_loader_takes_port_bind_and_name_from_the_args(tmp_path: Path) -> None:
    spec = fleet(
        """
        [[servers]]
        name = "v"
        engine = "vllm"
        model = "/m"
        args = ["--served-model-name", "tiny", "t2", "--port=8003", "--host", "0.0.0.0"]
    """,
        tmp_path,
    )
    server = spec.server("v")
    assert (server.port, server.bind, server.served_model_name) == (8003, "0.0.0.0", "tiny")
    item = Fleet(spec).resolve()[0]
    assert item.served_model == "tiny"
    assert item.argv.count("--port=8003") == 1 and "--port" not in item.argv and item.argv.count("--host") == 1


@pytest.mark.parametrize(
    ("engine", "args", "model_flag"),
    [
        ("vllm", ["--model", "/m/x"], "--model"),
        ("sglang", ["--model-path", "/m/x"], "--model-path"),
        ("llamacpp", ["-m", "/m/x"], "-m"),
        ("tgi", ["--model-id", "/m/x"], "--model-id"),
        ("sim", ["--model", "/m/x"], "--model"),
    ],
)
def test_a_model_given_only_in_the_args_is_the_model(
    tmp_path: Path, engine: str, args: list[str], model_flag: str
) -> None:
    spec = fleet(
        f"""
        [[servers]]
        name = "s"
        engine = "{engine}"
        port = 9000
        args = {json.dumps(args)}
    """,
        tmp_path,
    )
    item = Fleet(spec).resolve()[0]
    assert item.server.model == "/m/x" and item.served_model == "/m/x"  # what requests name when no served name is set
    assert item.argv.count(model_flag) == 1 and item.argv.count("/m/x") == 1


def test_a_model_in_both_places_must_agree(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model: model = '/a' conflicts with '--model /b' in args"):
        fleet(
            """
            [[servers]]
            name = "v"
            engine = "vllm"
            model = "/a"
            port = 8000
            args = ["--model", "/b"]
        """,
            tmp_path,
        )


def test_the_same_value_in_both_places_is_fine(tmp_path: Path) -> None:
    spec = fleet(
        """
        [[servers]]
        name = "s"
        engine = "sglang"
        model = "/m"
        port = 30000
        served_model_name = "q"
        gpus = [0, 1]
        args = ["--port", "30000", "--served-model-name", "q", "--tp", "2"]
    """,
        tmp_path,
    )
    item = Fleet(spec).resolve()[0]
    assert item.argv.count("--port") == 1 and item.argv.count("--served-model-name") == 1
    assert "--tp-size" not in item.argv


def test_conflicts_are_configuration_errors_naming_both_places(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        fleet(
            """
            [defaults]
            engine = "vllm"
            model = "/m"
            [[servers]]
            name = "v"
            port = 8000
            bind = "127.0.0.1"
            gpus = [0]
            served_model_name = "x"
            args = ["--served-model-name", "tiny", "--port=8001", "--host", "0.0.0.0", "-tp", "2"]
        """,
            tmp_path,
        )
    lines = str(err.value).splitlines()
    assert lines == [
        "fleet.toml: servers[0] \"v\": port: port = 8000 conflicts with '--port=8001' in args; set it in one place "
        "(the port field or the engine flag)",
        "fleet.toml: servers[0] \"v\": bind: bind = '127.0.0.1' conflicts with '--host 0.0.0.0' in args; set it in one "
        "place (the bind field or the engine flag)",
        "fleet.toml: servers[0] \"v\": served_model_name: served_model_name = 'x' conflicts with '--served-model-name tiny' "
        "in args; set it in one place (the served_model_name field or the engine flag)",
        "fleet.toml: servers[0] \"v\": gpus: gpus = [0] gives 1 GPU but '-tp 2' in args needs 2; list 2 GPUs or lower the flag",
    ]


def test_a_conflict_from_defaults_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"served_model_name = 'a' \(from \[defaults\]\) conflicts with '-a b'"):
        fleet(
            """
            [defaults]
            served_model_name = "a"
            [[servers]]
            name = "l"
            engine = "llamacpp"
            model = "/m.gguf"
            port = 8080
            args = ["-a", "b"]
        """,
            tmp_path,
        )


def test_a_port_only_in_the_args_still_counts_for_duplicates(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match='port: 8000 on host "local" is already used by server "a"'):
        fleet(
            """
            [defaults]
            engine = "sim"
            model = "m"
            [[servers]]
            name = "a"
            port = 8000
            [[servers]]
            name = "b"
            args = ["--port", "8000"]
        """,
            tmp_path,
        )


def test_up_stops_a_conflict_before_launching_with_exit_3(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        textwrap.dedent(f"""
        [fleet]
        state_dir = "{tmp_path / "state"}"
        [[servers]]
        name = "v"
        engine = "sim"
        model = "m"
        port = 8000
        args = {json.dumps(["--style", "vllm", "--port", "8001"])}
    """)
    )
    result = CliRunner().invoke(app, ["up", str(path)])
    assert result.exit_code == 3, result.output
    assert "port = 8000 conflicts with '--port 8001' in args" in result.output
    assert not (tmp_path / "state").exists()  # nothing was launched (no state, no log)


def test_one_parse_is_shared_and_read_only() -> None:
    args = ["--speculative-config", '{"method": "ngram"}']
    native = get_engine("vllm").native_args(args)
    assert get_engine("vllm").native_args(list(args)) is native  # parsed once per argument list
    with pytest.raises(TypeError):
        native.values["speculative"]["method"] = "eagle"  # type: ignore[index]  # values is a JSON-like mapping; the test knows its shape
    with pytest.raises(TypeError):
        native.values["port"] = 1  # type: ignore[index]  # values is a JSON-like mapping; the test knows its shape
