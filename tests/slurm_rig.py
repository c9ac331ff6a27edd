"""A real one-node Slurm cluster on this machine for tests and benchmarks.

The rig writes a ``slurm.conf`` (and ``gres.conf``) into a temporary folder and starts Debian's
``munged``, ``slurmctld`` and ``slurmd`` as plain daemons in the foreground of child processes
(no systemd), each with its state, spool, pid and log files in that folder and its own ports on
127.0.0.1. The node declares two GPUs as GRES over placeholder files (``AutoDetect=off``: there
is no GPU here, and none is needed to schedule one), more CPUs than the machine has
(``SlurmdParameters=config_overrides``) so a few one-CPU servers run at once, and keeps finished
jobs visible to ``squeue --states=all`` for ``MinJobAge`` seconds. Process tracking is
``proctrack/linuxproc`` and tasks are not confined (``task/none``): containers refuse cgroups.

Client commands find the cluster through ``SLURM_CONF`` (``env``). Start waits until the node
is idle by polling ``sinfo`` against a deadline; stop ends the daemons it started, by pid.

Install Slurm with ``scripts/ci-slurm-setup.sh`` (Debian's slurm-wlm and munge).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SETUP = "scripts/ci-slurm-setup.sh"
SKIP_ENV = "SERVEFLEET_SKIP_SLURM"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "sacct")
GPUS = 2
CPUS = 16


def slurm_unavailable_reason() -> str | None:
    """Why the rig cannot run here (with the command that fixes it), or None when it can."""
    missing = [
        tool for tool in (*DAEMONS, *CLIENTS) if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}")
    ]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not found): run `sudo sh {SETUP}` (apt-get install slurm-wlm munge), or set {SKIP_ENV}=1 to skip the Slurm tests"
    if os.geteuid() != 0:
        return f"the Slurm rig runs slurmd as root; run the Slurm tests as root, or set {SKIP_ENV}=1 to skip them"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmCluster:
    root: Path
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    partition: str = "debug"
    min_job_age: int = 300
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """What a client command needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        r = self.root
        for sub in ("munge", "ctld", "spool", "dev", "log"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        devices = []
        for i in range(GPUS):  # placeholder "devices": slurmd only needs the files to exist
            dev = r / "dev" / f"gpu{i}"
            dev.touch()
            devices.append(str(dev))
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, d_port = _free_port(), _free_port()
        self.conf.write_text(
            f"""ClusterName=servefleet-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/ctld
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/ctld/slurmctld.pid
SlurmdPidFile={r}/spool/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
LaunchParameters=use_interactive_step
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge={self.min_job_age}
KillWait=2
InactiveLimit=0
Waittime=0
MessageTimeout=10
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldDebug=info
SlurmdDebug=info
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory=4096 Gres=gpu:{GPUS} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        )
        (r / "gres.conf").write_text(f"AutoDetect=off\nNodeName={self.node} Name=gpu File={r}/dev/gpu[0-{GPUS - 1}]\n")

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        self._write_config()
        r = self.root
        env = {**os.environ, **self.env}
        out = open(r / "log" / "daemons.out", "ab")
        self.procs["munged"] = subprocess.Popen(
            [
                _daemon("munged"),
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={r}/munge/munge.key",
                f"--pid-file={r}/munge/munged.pid",
                f"--log-file={r}/log/munged.log",
                f"--seed-file={r}/munge/munged.seed",
            ],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        self._until(lambda: self.munge_socket.exists(), timeout, "munged's socket")
        self.procs["slurmctld"] = subprocess.Popen(
            [_daemon("slurmctld"), "-D", "-i", "-f", str(self.conf)],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        self.procs["slurmd"] = subprocess.Popen(
            [_daemon("slurmd"), "-D", "-f", str(self.conf), "-N", self.node],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        self._until(self._node_idle, timeout, f"node {self.node} to be idle in sinfo")
        return self

    def _node_idle(self) -> bool:
        try:
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T", "-n", self.node],
                capture_output=True,
                text=True,
                timeout=10,
                env={**os.environ, **self.env},
            )
        except subprocess.TimeoutExpired:
            return False
        return out.returncode == 0 and out.stdout.strip().rstrip("*") == "idle"

    def _until(self, predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} while waiting for {what}; see {self.root}/log/"
                    )
            if predicate():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}; see {self.root}/log/")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A client command against this cluster."""
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=30, check=check, env={**os.environ, **self.env}
        )

    def jobs(self) -> list[str]:
        """Lines ``JOBID STATE NAME`` of every job the controller still knows (all states)."""
        out = self.run("squeue", "-h", "--states=all", "-o", "%i %T %j").stdout
        return [line for line in out.splitlines() if line.strip()]

    def live_jobs(self) -> list[str]:
        return [
            line
            for line in self.jobs()
            if line.split()[1] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")
        ]

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until no job is live and the node is idle: a test that needs the whole node, on the
        session's shared cluster, after tests whose jobs may still be completing."""
        self._until(lambda: not self.live_jobs() and self._node_idle(), timeout, "no live job and an idle node")

    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user", "root", check=False)  # the jobs' processes end with them
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()
