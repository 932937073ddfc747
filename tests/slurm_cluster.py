"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd, each a
process of ours with every file (key, sockets, state, logs) in one private directory.

    reason = slurm_cluster.unavailable()     # None, or why the cluster cannot run here
    with slurm_cluster.Cluster(cpus=8) as c:
        subprocess.run(["srun", "-n", "4", ...], env=c.env())

Debian's slurm-wlm and munge provide the daemons (scripts/setup.sh --test installs them
as root). The node is this host under its own short name at 127.0.0.1, so what Slurm
tells a job (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST) is a name this host answers to.
It says it has `cpus` CPUs whatever the machine has (SlurmdParameters=config_overrides):
a machine of two cores runs four one-CPU tasks. Ports are picked free at start, so two
clusters (two test workers) never meet; give each its own first_job_id too, as the
job ids pick the port a job step's rank 0 serves its rendezvous on. Nothing is installed or changed outside the
directory: no systemd unit, no /etc file; stopping ends every job and step, then the
daemons, then removes the directory.
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "salloc", "squeue", "scancel", "sinfo", "scontrol")


def _which(prog):
    return shutil.which(prog, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin")


def unavailable():
    """Why a cluster cannot be started here, or None."""
    missing = [p for p in DAEMONS + CLIENTS if _which(p) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing); scripts/setup.sh "
                f"--test installs Debian's slurm-wlm and munge when run as root")
    if os.geteuid() != 0:
        return ("a one-node Slurm cluster runs its daemons as root (slurmd starts each "
                "task as its user); run the tests as root")
    return None


def _free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ClusterError(RuntimeError):
    pass


class Cluster:
    def __init__(self, cpus=8, start_timeout=60, first_job_id=1):
        self.cpus = cpus
        self.first_job_id = first_job_id
        self.start_timeout = start_timeout
        self.node = socket.gethostname().split(".")[0]
        self.dir = None
        self.procs = {}

    # ---------------------------------------------------------------- start

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def _path(self, name):
        return os.path.join(self.dir, name)

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="hvdslurm-")
        os.chmod(self.dir, 0o755)       # slurmstepd and the tasks read the config here
        for sub in ("state", "spool", "munge"):
            os.mkdir(self._path(sub), 0o700)
        key = self._path("munge/munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.munge_socket = self._path("munge/munge.socket")
        self._spawn("munged", [_which("munged"), "--foreground", "--force",
                               f"--key-file={key}", f"--socket={self.munge_socket}",
                               f"--pid-file={self._path('munge/munged.pid')}",
                               f"--seed-file={self._path('munge/munged.seed')}",
                               f"--log-file={self._path('munged.log')}"])
        self._wait_for(lambda: os.path.exists(self.munge_socket), "munged's socket")
        ctld_port, slurmd_port = _free_ports(2)
        self.conf = self._path("slurm.conf")
        with open(self.conf, "w") as f:
            f.write(self._config(ctld_port, slurmd_port))
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", self.conf])
        self._spawn("slurmd", [_which("slurmd"), "-D", "-f", self.conf, "-N", self.node])
        self._wait_for(self._node_idle, f"node {self.node} to be idle in slurmctld")

    def _config(self, ctld_port, slurmd_port):
        d = self.dir
        return f"""\
# A one-node cluster for horovodlike's tests (tests/slurm_cluster.py).
ClusterName=hvdtest
FirstJobId={self.first_job_id}
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: processes are tracked by their parentage.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
# Use the CPU count below, not what the machine has.
SlurmdParameters=config_overrides
# Quick to notice a task that ended: srun waits this long for the rest after one fails
# only when told to (--kill-on-bad-exit); keep the rest of the timers short.
KillWait=5
MessageTimeout=10
InactiveLimit=0
MinJobAge=30
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=30 State=UP OverSubscribe=NO
"""

    def _spawn(self, name, argv):
        log = open(self._path(f"{name}.out"), "wb")
        try:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.env(),
                                                start_new_session=True)
        finally:
            log.close()

    def _wait_for(self, ready, what):
        """Poll `ready` until true; a daemon that exits, or the time running out, raises
        with the daemons' logs."""
        deadline = time.monotonic() + self.start_timeout
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else \
                    f"not within {self.start_timeout} s"
                raise ClusterError(f"Slurm test cluster: waiting for {what}: {why}\n"
                                   + self.logs())
            time.sleep(0.2)     # a poll interval: the daemons have no readiness signal

    def _node_idle(self):
        res = subprocess.run([_which("sinfo"), "-h", "-n", self.node, "-o", "%T"],
                             env=self.env(), capture_output=True, text=True, timeout=30)
        return res.returncode == 0 and res.stdout.strip() == "idle"

    # ---------------------------------------------------------------- use

    def env(self, base=None):
        """The environment a client (srun, sbatch) of this cluster runs in."""
        env = dict(os.environ if base is None else base)
        for k in list(env):
            if k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")):
                del env[k]
        env["SLURM_CONF"] = self._path("slurm.conf")
        return env

    def logs(self, lines=40):
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log", "munged.out",
                     "slurmctld.out", "slurmd.out"):
            try:
                with open(self._path(name), errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
            except OSError:
                continue
            if tail:
                out.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(out)

    def jobs(self):
        res = subprocess.run([_which("squeue"), "-h", "-o", "%i %T"], env=self.env(),
                             capture_output=True, text=True, timeout=30)
        return [line.split() for line in res.stdout.splitlines() if line.strip()]

    ACTIVE = ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING", "SUSPENDED")

    def wait_idle(self, timeout=30):
        """Whether the queue empties of active jobs within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while [j for j in self.jobs() if j[1] in self.ACTIVE]:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)     # a poll interval: squeue is the only view of the queue
        return True

    def wait_job(self, job, timeout):
        """(state, exit code) of a batch job once it has ended, e.g. ("COMPLETED",
        "0:0"); raises ClusterError if it is still active after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            res = subprocess.run([_which("scontrol"), "-o", "show", "job", str(job)],
                                 env=self.env(), capture_output=True, text=True,
                                 timeout=30)
            fields = dict(f.split("=", 1) for f in res.stdout.split() if "=" in f)
            state = fields.get("JobState")
            if state and state not in self.ACTIVE:
                return state, fields.get("ExitCode")
            if time.monotonic() > deadline:
                self.cancel_all()
                raise ClusterError(f"job {job} still {state} after {timeout} s\n"
                                   + self.logs())
            time.sleep(0.2)     # a poll interval: scontrol is the only view of the job

    def cancel_all(self, timeout=30):
        """scancel every job and wait until the queue is empty (bounded)."""
        if "slurmctld" not in self.procs or self.procs["slurmctld"].poll() is not None:
            return
        subprocess.run([_which("scancel"), "--full", "--signal=KILL", "-u", "root"],
                       env=self.env(), capture_output=True, timeout=30)
        self.wait_idle(timeout)

    # ---------------------------------------------------------------- stop

    def _strays(self):
        """Processes of this cluster left over (slurmstepd and the tasks it started):
        those whose environment names our slurm.conf, or slurmstepd whose spool is ours."""
        marker = f"SLURM_CONF={self._path('slurm.conf')}".encode()
        mine = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if marker in env or (cmd.startswith(b"slurmstepd") and
                                 self.dir.encode() in b" ".join(env)):
                mine.append(int(pid))
        return mine

    def stop(self):
        if self.dir is None:
            return
        try:
            self.cancel_all()
        except (OSError, subprocess.SubprocessError):
            pass
        for name in reversed(DAEMONS):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            except ProcessLookupError:
                p.wait()
        for pid in self._strays():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
