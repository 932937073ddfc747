"""The launch contract: what a launcher tells each rank, and where the ranks meet.

Every launcher sets these variables in a rank's environment -- horovodlikerun (static,
runner/launch.py, and elastic, runner/elastic_driver.py), ``horovodlike.run``, the Ray
executor, ``horovodlike.spark.run``, and launch_env for torchrun-style environments --
and a rank's start-up (bootstrap, elastic, mpi_end) reads them. The names are spelled
here and nowhere else; they are what users' job specs and the docs name, so they never
change. The store keys the launcher and the ranks both write are built here too.

Not here: the tuning knobs Horovod's flags become (``HOROVOD_FUSION_THRESHOLD`` ...,
runner/job_env.py maps them; the engine reads them in C), and a component's own knobs
(``HOROVODLIKE_BUCKET_BYTES``, ``HOROVODLIKE_STORE_MAX_VALUE_BYTES`` ...), each declared
beside the one place that reads it.
"""
import os
import uuid

# ------------------------------------------------------------------ who a rank is
# Horovod's names: horovodrun sets the same ones, so a script reading them works.
RANK = "HOROVOD_RANK"
SIZE = "HOROVOD_SIZE"
LOCAL_RANK = "HOROVOD_LOCAL_RANK"
LOCAL_SIZE = "HOROVOD_LOCAL_SIZE"
CROSS_RANK = "HOROVOD_CROSS_RANK"
CROSS_SIZE = "HOROVOD_CROSS_SIZE"
HOSTNAME = "HOROVOD_HOSTNAME"          # the name the rank's host is known by

# ------------------------------------------------------------------ where ranks meet
STORE_ADDR = "HOROVODLIKE_STORE_ADDR"   # host:port of the launcher's rendezvous store
JOB_ID = "HOROVODLIKE_JOB_ID"           # names this job's keys in the store
JOB_KEY = "HOROVODLIKE_JOB_KEY"         # the job's secret, 64 hex digits (common/jobkey.py)
# Where the engine listens when the launcher knows better than the rank: loopback when
# every rank runs on the launcher's host.
BIND_ADDR = "HOROVODLIKE_BIND_ADDR"
DEFAULT_JOB_ID = "job"                  # a rank given no job id (a hand-made environment)

# How long start-up may take (the store exchange in hvd.init(), a key file to appear).
START_TIMEOUT = "HOROVODLIKE_START_TIMEOUT"
# horovodrun's name: the launcher's --start-timeout default, and passed on to the ranks.
HOROVOD_START_TIMEOUT = "HOROVOD_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 60              # seconds

# How long a peer may stay silent before the engine names it lost (the engine reads it;
# engine/config.c has the same default). horovodlikerun's --gloo-timeout-seconds sets it.
PEER_TIMEOUT = "HOROVODLIKE_PEER_TIMEOUT_SECONDS"
DEFAULT_PEER_TIMEOUT = 30               # seconds

# ------------------------------------------------------------------ network
IFACE = "HOROVOD_GLOO_IFACE"            # the interface ranks (and the store) bind to
IFACE_ALIAS = "HOROVODLIKE_IFACE"       # the same, under our own name
IFACE_ADDR = "HOROVODLIKE_IFACE_ADDR"   # the address a rank advertises to its peers
STORE_HOST = "HOROVODLIKE_STORE_HOST"   # the store's address as ranks on other hosts see it

# ------------------------------------------------------------------ elastic
ELASTIC = "HOROVOD_ELASTIC"             # "1" in an elastic job's workers (Horovod's name)
ELASTIC_WORKER = "HOROVODLIKE_ELASTIC_WORKER"   # the worker id the driver gave a process
ELASTIC_ROUND = "HOROVODLIKE_ELASTIC_ROUND"     # the round its engine starts in
ELASTIC_TIMEOUT = "HOROVOD_ELASTIC_TIMEOUT"     # seconds to wait for --min-np slots
DEFAULT_ELASTIC_TIMEOUT = 600

# ------------------------------------------------------------------ the launcher's own
SSH_COMMAND = "HOROVODLIKE_SSH_COMMAND"         # --ssh-command's default
REMOTE_PYTHON = "HOROVODLIKE_REMOTE_PYTHON"     # the interpreter ranks run on other hosts

# ------------------------------------------------------------------ other launchers
# torchrun, Kubeflow, Ray Train, Spark's TorchDistributor (common/launch_env.py).
RENDEZVOUS_PORT = "HOROVODLIKE_RENDEZVOUS_PORT"  # the store's port instead of MASTER_PORT+1
JOB_KEY_FILE = "HOROVODLIKE_JOB_KEY_FILE"        # a key file on storage every host shares
# Running a multi-host job with a key anyone can compute takes this, set to 1: a name
# nobody sets by accident, and that reads as what it does in a job's spec.
INSECURE_RENDEZVOUS = "HOROVODLIKE_INSECURE_UNAUTHENTICATED_RENDEZVOUS"


def _seconds(environ, name, default):
    value = (os.environ if environ is None else environ).get(name)
    if value in (None, ""):
        return float(default)
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if not seconds >= 0:
        raise ValueError(f"{name}={value!r} must be >= 0")
    return seconds


def start_timeout(environ=None):
    """Seconds start-up may take: START_TIMEOUT, else DEFAULT_START_TIMEOUT."""
    return _seconds(environ, START_TIMEOUT, DEFAULT_START_TIMEOUT)


def peer_timeout(environ=None):
    """Seconds of silence before the engine names a peer lost: PEER_TIMEOUT, else the
    default. As the engine reads it (engine/core/config.c): a value that is not a number
    stands for the default there, with a warning."""
    try:
        return _seconds(environ, PEER_TIMEOUT, DEFAULT_PEER_TIMEOUT)
    except ValueError:
        return float(DEFAULT_PEER_TIMEOUT)


def elastic_timeout(environ=None):
    """Seconds an elastic job waits for enough slots: ELASTIC_TIMEOUT, else the default."""
    return _seconds(environ, ELASTIC_TIMEOUT, DEFAULT_ELASTIC_TIMEOUT)


def iface(environ=None):
    """The network interface the job is told to use, or None."""
    env = os.environ if environ is None else environ
    return env.get(IFACE) or env.get(IFACE_ALIAS) or None


def job_id(environ=None):
    env = os.environ if environ is None else environ
    return env.get(JOB_ID) or DEFAULT_JOB_ID


def new_job_id():
    """A fresh job id: 12 hex digits, unique enough to keep two jobs' keys apart."""
    return uuid.uuid4().hex[:12]


def rank_vars(rank, size, local_rank=None, local_size=None, cross_rank=None,
              cross_size=None, hostname=None):
    """The who-am-I variables of one rank, as strings; unknown ones are left out."""
    values = {RANK: rank, SIZE: size, LOCAL_RANK: local_rank, LOCAL_SIZE: local_size,
              CROSS_RANK: cross_rank, CROSS_SIZE: cross_size, HOSTNAME: hostname}
    return {k: str(v) for k, v in values.items() if v is not None}


# ------------------------------------------------------------------ store keys
# Everything a job writes into its store lives under its job id. A rank's address blob:
#   <job>/init<generation>/blob/<rank>   a static job's generation-th init
#   <job>/elastic<round>/blob/<rank>     an elastic job's round (the driver writes a
#                                        blob of one NUL byte for a member that is gone,
#                                        so the others give that round up at once)
# The elastic driver and its workers talk under <job>/elastic/ (common/elastic.py).

def blob_key(job, rank, *, elastic_round=None, generation=0):
    """The store key of `rank`'s address blob (see above)."""
    stage = f"elastic{elastic_round}" if elastic_round is not None else f"init{generation}"
    return f"{job}/{stage}/blob/{rank}"


class ElasticKeys:
    """The keys of the elastic driver's conversation with its workers, under
    <job>/elastic/ (common/elastic.py says what each value holds)."""
    __slots__ = ("base",)

    def __init__(self, job):
        self.base = f"{job}/elastic"

    @property
    def ready_seq(self):
        """A counter: each worker that waits for a round takes the next number."""
        return f"{self.base}/ready_seq"

    def ready(self, n):
        """The n-th worker's ready record."""
        return f"{self.base}/ready/{n}"

    @property
    def current(self):
        """The newest round's number."""
        return f"{self.base}/current"

    def assignment(self, round_, worker):
        """What the driver tells `worker` for round `round_`."""
        return f"{self.base}/r{round_}/w{worker}"

    def update(self, k):
        """The k-th host update."""
        return f"{self.base}/update/{k}"
