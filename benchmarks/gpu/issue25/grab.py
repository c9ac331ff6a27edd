"""A foreign process that takes the GPU's free memory the moment a server's log reaches a start-up phase, so that
the engine's next allocation fails there: issue 25 item 6's memory failures, recorded from a real engine in each
phase (oom_phases.sh). It starts its CUDA context first (a foreign holder from before the launch, as on a shared
card), writes ARMED, then polls LOG (raw bytes: tqdm's progress bars end in \\r, not \\n) for REGEX, takes all but
MARGIN_MIB of the free memory, reports what it holds as a JSON line
and keeps it until SIGTERM. --dry: no CUDA (the CPU check of the watch).
Usage: grab.py LOG REGEX ARMED [--margin-mib N] [--timeout S] [--dry]"""

import argparse
import json
import os
import re
import signal
import sys
import time

MIB = 1 << 20


def watch(log: str, pattern: re.Pattern[bytes], deadline: float) -> float | None:
    """Seconds from the log's creation until PATTERN appears in it (None: the deadline passed first). A pattern
    split across two reads is still found: the last 4 KiB are searched again with the new bytes."""
    tail, pos = b"", 0
    while time.monotonic() < deadline:
        try:
            with open(log, "rb") as f:
                f.seek(pos)
                new = f.read()
        except FileNotFoundError:
            new = b""
        if new:
            pos += len(new)
            tail += new
            if pattern.search(tail):
                return time.time() - os.path.getctime(log)
            tail = tail[-4096:]
        else:
            time.sleep(0.02)  # a poll interval, not a wait for an event: the log has no notifier here
    return None


def take_free(margin_mib: int) -> list:
    """All but MARGIN_MIB of the free memory: one block 256 MiB short of it (one cudaMalloc, fast enough to win the
    race with a weight load), then 64-MiB and 2-MiB pieces (torch's rounding) until none fits."""
    import torch

    held = []
    free, _ = torch.cuda.mem_get_info()
    try:
        held.append(torch.empty(max(0, free - (256 + margin_mib) * MIB), dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass  # the engine took some meanwhile: pieces only
    for piece in (64 * MIB, 2 * MIB):
        while torch.cuda.mem_get_info()[0] >= piece + margin_mib * MIB:
            try:
                held.append(torch.empty(piece, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                break
    return held


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("regex")
    ap.add_argument("armed")
    ap.add_argument("--margin-mib", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    if not a.dry:
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda")  # the context, before the engine starts
    with open(a.armed, "w") as f:
        f.write(str(os.getpid()))
    at = watch(a.log, re.compile(a.regex.encode()), time.monotonic() + a.timeout)
    if at is None:
        print(json.dumps({"matched": False, "regex": a.regex}), flush=True)
        return 3
    t0 = time.monotonic()
    held = [] if a.dry else take_free(a.margin_mib)
    report = {"matched": True, "regex": a.regex, "log_age_s": round(at, 2), "grab_s": round(time.monotonic() - t0, 3)}
    if not a.dry:
        import torch

        report["held_gib"] = round(sum(t.numel() for t in held) / (1 << 30), 2)
        report["free_after_mib"] = round(torch.cuda.mem_get_info()[0] / MIB)
    print(json.dumps(report), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
