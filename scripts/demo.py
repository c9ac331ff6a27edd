#!/usr/bin/env python3
"""The main job on the embedded default, end to end (what `make demo` runs):

1. build the tiny model locally            servefleet model tiny demo-out/tiny-llama
2. launch a fleet of two CPU servers        servefleet up examples/demo.toml
3. show the status table                    servefleet status --fleet examples/demo.toml
4. send a few completions to both servers   (plain HTTP, below)
5. stop everything                          servefleet down --fleet examples/demo.toml

Each step is the real command, printed before it runs, so the demo doubles as a tutorial. The
fleet is stopped whatever happens (a failure or Ctrl-C included). No GPU, no download.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLEET = REPO / "examples" / "demo.toml"
MODEL = REPO / "demo-out" / "tiny-llama"
SERVEFLEET = [str(Path(sys.executable).parent / "servefleet")]
PROMPTS = [
    ("text", "The fleet of servers"),
    ("chat", "Say hello to the demo."),
    ("text", "Once upon a time"),
    ("chat", "What is a KV cache?"),
]


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"\n== {text}", flush=True)


def run(*args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [*SERVEFLEET, *args]
    shown = shlex.join([_short(a) for a in argv])
    print(f"$ {shown}", flush=True)
    proc = subprocess.run(argv, cwd=REPO, text=True, capture_output=capture)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo: `{shown}` failed with exit code {proc.returncode}")
    return proc


def _short(arg: str) -> str:
    """Paths inside the repository, as a person would type them."""
    try:
        return str(Path(arg).relative_to(REPO)) if arg.startswith("/") else arg
    except ValueError:
        return arg


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def send_completions(max_tokens: int) -> int:
    """Round-robin a few prompts over the ready servers; print each answer. Returns failures."""
    status = json.loads(run("status", "--fleet", str(FLEET), "--json", capture=True).stdout)
    servers = [s for s in status["servers"] if s["state"] == "ready"]
    if not servers:
        print("no server is ready")
        return len(PROMPTS)
    failures = 0
    for i, (kind, prompt) in enumerate(PROMPTS):
        server = servers[i % len(servers)]
        base, model = server["base_url"], server["served_model"]
        started = time.monotonic()
        try:
            if kind == "chat":
                answer = post(base + "/v1/chat/completions", {
                    "model": model, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "temperature": 0.8, "seed": i})
                text = answer["choices"][0]["message"]["content"]
            else:
                answer = post(base + "/v1/completions", {
                    "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "seed": i})
                text = answer["choices"][0]["text"]
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            failures += 1
            print(f"  {server['name']:6s} {kind:4s} {prompt!r}: FAILED ({exc})")
            continue
        usage = answer.get("usage") or {}
        print(f"  {server['name']:6s} {kind:4s} {prompt!r} -> {text!r}  "
              f"[{usage.get('prompt_tokens', '?')}+{usage.get('completion_tokens', '?')} tokens, {time.monotonic() - started:.2f}s]")
    print("  (random weights: the words are the tokenizer's, the sense is nobody's)")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description="servefleet demo: the main job on two CPU `transformers serve` servers")
    parser.add_argument("--keep", action="store_true", help="leave the fleet running at the end (stop it with `servefleet down`)")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    say("1/5 build the tiny model (random weights, tokenizer trained here, nothing downloaded)")
    run("model", "tiny", str(MODEL), "--force")

    failed = 0
    try:
        say("2/5 launch the fleet: two `transformers serve` servers on the CPU, detached, verified ready")
        up = run("up", str(FLEET), check=False)
        if up.returncode != 0:
            print(f"demo: `servefleet up` exited with {up.returncode}; see the table above and "
                  f"`servefleet logs NAME --fleet {_short(str(FLEET))}`")
            failed += 1
        say("3/5 the status table (any terminal can ask: state lives in files)")
        run("status", "--fleet", str(FLEET), check=False)
        if not failed:
            say("4/5 a few completions, spread over both servers")
            failed += send_completions(args.max_tokens)
    except KeyboardInterrupt:
        failed += 1
        print("\ninterrupted")
    finally:
        if args.keep and not failed:
            say("5/5 left running (--keep): stop it with")
            print(f"$ {shlex.join([_short(SERVEFLEET[0]), 'down', '--fleet', _short(str(FLEET))])}")
        else:
            say("5/5 stop the fleet: whole process groups, ports confirmed free")
            run("down", "--fleet", str(FLEET), check=False)
    say("demo " + ("finished" if not failed else "FAILED"))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
