"""Keep oom_phases.sh's logs as real fixtures: each phase's server log, byte for byte, as
tests/fixtures/logs/real/PREFIX_NAME.log, and its EXPECTED.json record in the format h200_failures.py writes: what
`servefleet diagnose` says from the log alone (run here, with the vLLM profile and auto-detected), what `up` said live
(NAME-up.json, where the device brought it back) and the server's argv.
Usage: oom_fixtures.py OOM_DIR FIXTURES_DIR --prefix vllm026_h100_oom --recorded "H100, vLLM 0.26.0, ..." """

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/gpu: h200_failures
from h200_failures import expected_entry
from oom_summary import PHASES, load

SCENARIO = {
    "load": "a foreign process took the GPU's free memory at 'Using V2 Model Runner' (before the model's tensors)",
    "profile": "a foreign process took the GPU's free memory at 'Model loading took' (torch.compile, profiling run)",
    "kv": "a foreign process took the GPU's free memory at 'Initial profiling/warmup run' (KV cache size, allocation)",
    "graphs": "a foreign process took the GPU's free memory at 'Capturing CUDA graphs' (mid-capture)",
    "warmup": "a foreign process took the GPU's free memory at 'Graph capturing finished' (the warm-up after capture)",
    "request": "a foreign process took the GPU's free memory at 'Starting vLLM server on', then long prompts at 256",
}


def diagnose(log: Path, engine: str) -> dict:
    cmd = [sys.executable, "-m", "servefleet.cli.main", "diagnose", str(log), "--engine", engine, "--json"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=False).stdout or "{}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("oom_dir", type=Path)
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--recorded", required=True)
    args = ap.parse_args()
    expected_path = args.fixtures / "EXPECTED.json"
    expected = json.loads(expected_path.read_text())
    for name in PHASES:
        log = args.oom_dir / f"{name}.log"
        if not log.exists():
            continue
        fixture = f"{args.prefix}_{name}.log"
        shutil.copyfile(log, args.fixtures / fixture)
        server = (load(args.oom_dir / f"{name}-up.json").get("servers") or [{}])[0]
        diag = diagnose(args.fixtures / fixture, "vllm")
        entry = {"diagnose_vllm": diag, "diagnose_auto": diagnose(args.fixtures / fixture, "auto")}
        record = expected_entry({**entry, "verdict": server.get("verdict")}, SCENARIO[name], server.get("argv"))
        if not server:
            record["live_verdict"] = None  # up's JSON did not come back from the device: the call's table has it
        record["phase"] = diag.get("phase")
        record["recorded"] = args.recorded
        expected[fixture] = record
        print(f"{fixture}: {record['state']} {record['category']} {record['phase']} | {record['evidence_substring']}")
    expected_path.write_text(json.dumps(expected, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
