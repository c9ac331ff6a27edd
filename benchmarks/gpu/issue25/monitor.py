"""What the host does while a job runs, once a second, to tell GPU drift from CPU contention: the GPU's SM clock, power,
temperature, utilisation and active throttle reasons (nvidia-smi), the host CPUs' mean clock (/proc/cpuinfo: a turbo that
fades under load slows a CPU-bound engine), the share of CPU time the hypervisor gave to other guests (steal, /proc/stat:
a VM's CPUs shared with its neighbours), and the CPU share of each busy process (/proc: the vLLM API process, its
EngineCore, servefleet's generate). One JSON line a second until STOP_FILE exists. monitor_jobs.py reads it per job.
Usage: monitor.py OUT.jsonl STOP_FILE"""

import json
import os
import subprocess
import sys
import time

out, stop = sys.argv[1], sys.argv[2]
TICK = os.sysconf("SC_CLK_TCK")
GPU = "clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active"


def cpu_ticks() -> dict[int, tuple[str, int]]:
    """pid -> (command line, user + system ticks) of every process."""
    seen = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]  # room for generate's --output
        except OSError:
            continue
        seen[int(pid)] = (cmd, int(fields[11]) + int(fields[12]))
    return seen


def cpu_times() -> list[int]:
    """The host's CPU time so far, in ticks: user, nice, system, idle, iowait, irq, softirq, steal (/proc/stat)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def steal_pct(before: list[int], now: list[int]) -> float | None:
    """The share of the host's CPU time the hypervisor gave to other guests between two readings, in %."""
    total = sum(now) - sum(before)
    return round(100 * (now[7] - before[7]) / total, 1) if total > 0 else None


def cpu_mhz() -> float | None:
    """The mean clock of the host's CPUs now (None where /proc/cpuinfo does not say)."""
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except OSError:
        return None
    return round(sum(mhz) / len(mhz)) if mhz else None


t0, before, times = time.monotonic(), cpu_ticks(), cpu_times()
with open(out, "a") as sink:
    while not os.path.exists(stop):
        time.sleep(1.0)
        now = cpu_ticks()
        busy = {
            f"{pid} {cmd}": round(100 * (ticks - before[pid][1]) / TICK, 1)
            for pid, (cmd, ticks) in now.items()
            if pid in before and ticks - before[pid][1] >= 0.2 * TICK
        }
        before = now
        times, times_before = cpu_times(), times
        try:
            gpu = subprocess.run(
                ["nvidia-smi", f"--query-gpu={GPU}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            gpu = ""
        sink.write(
            json.dumps(
                {
                    "t": round(time.monotonic() - t0, 2),
                    "gpu": gpu,
                    "cpu_mhz": cpu_mhz(),
                    "steal_pct": steal_pct(times_before, times),
                    "cpu_pct": busy,
                }
            )
            + "\n"
        )
        sink.flush()
