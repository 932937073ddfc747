"""Two fake nodes joined by a shaped link (or, rate=None, the bare veth), for the
hierarchical-vs-flat and point-to-point benchmarks.

    with TwoNodes(rate="1gbit") as net:      # needs root and iproute2 (ip, tc)
        net.launcher_args()                  # horovodlikerun -H ... --ssh-command ...

Each node is a network namespace with a veth into a bridge in the root namespace; each
namespace's egress is shaped with tc's token bucket to `rate`. Ranks are started inside
the namespaces by horovodlikerun's remote-command template (`ip netns exec {host} ...`),
so they see only their own node's loopback and the shaped link. All addresses are the
test's own, on the link it made; everything is removed on exit.
"""
import shutil
import subprocess

# Each TwoNodes claims a free index k by creating its bridge (creation fails if another
# holds it), and names everything after it: bridge hvdl-br{k}, namespaces hvdl{k}-n1/-n2,
# veths hvdl{k}v1/p1..., subnet 10.231.{k}.0/24. Two users at once (a benchmark beside
# the tests) never touch each other's devices.
SUBNET_PREFIX = "10.231"
MAX_INDEX = 250
# Inside its namespace each node's end of the link is renamed to this one name (names are
# per namespace), so that a peer which must be told its interface (gloo's
# GLOO_SOCKET_IFNAME) gets the same answer on every node.
LINK = "hvdl-link"


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def available():
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "ip/tc (iproute2) are not installed"
    probe = sh("ip", "netns", "add", "hvdl-probe", check=False)
    if probe.returncode:
        return f"cannot create network namespaces: {probe.stderr.strip()}"
    sh("ip", "netns", "del", "hvdl-probe", check=False)
    return None


class TwoNodes:
    def __init__(self, rate="1gbit"):
        self.rate, self.index, self.nodes = rate, None, ()

    @property
    def bridge(self):
        return f"hvdl-br{self.index}"

    @property
    def subnet(self):
        return f"{SUBNET_PREFIX}.{self.index}"

    def _claim(self):
        for k in range(1, MAX_INDEX + 1):
            if sh("ip", "link", "add", f"hvdl-br{k}", "type", "bridge", check=False).returncode == 0:
                return k
        raise RuntimeError(f"no free fake-node index: hvdl-br1..hvdl-br{MAX_INDEX} all exist")

    def __enter__(self):
        self.index = self._claim()
        self.nodes = (f"hvdl{self.index}-n1", f"hvdl{self.index}-n2")
        try:
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _build(self):
        k = self.index
        sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, ns in enumerate(self.nodes, start=1):
            inside, outside = f"hvdl{k}p{i}", f"hvdl{k}v{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", ns)
            sh("ip", "link", "set", outside, "master", self.bridge)
            sh("ip", "link", "set", outside, "up")
            run = ("ip", "netns", "exec", ns)
            sh(*run, "ip", "link", "set", inside, "name", LINK)
            sh(*run, "ip", "addr", "add", f"{self.address(i)}/24", "dev", LINK)
            sh(*run, "ip", "link", "set", LINK, "up")
            sh(*run, "ip", "link", "set", "lo", "up")
            if self.rate:              # None: the veth as it is (no shaping)
                sh(*run, "tc", "qdisc", "add", "dev", LINK, "root", "tbf", "rate", self.rate,
                   "burst", "256kb", "latency", "50ms")

    def __exit__(self, *exc):
        if self.index is None:
            return
        for i, ns in enumerate(self.nodes, start=1):
            # deleting a namespace deletes its veth pair too, but only once nothing holds
            # the namespace any more: the pair goes now, so its names are free again
            sh("ip", "link", "del", f"hvdl{self.index}v{i}", check=False)
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)
        self.index = None

    def address(self, node):
        """Node `node`'s (1 or 2) address on the link."""
        return f"{self.subnet}.{10 + node}"

    def env(self):
        return {"HOROVODLIKE_STORE_HOST": f"{self.subnet}.1"}

    def torch_env(self):
        """What torch.distributed + gloo ranks need here: the rendezvous on node 1 (where
        rank 0 runs) and the link as gloo's interface."""
        return {"MASTER_ADDR": self.address(1), "GLOO_SOCKET_IFNAME": LINK}

    def sent_bytes(self):
        """Bytes each node has sent into the link so far (tc's counter of its egress
        qdisc), a tuple per node: what crossed between nodes, whatever sent it."""
        out = []
        for ns in self.nodes:
            text = sh("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", LINK).stdout
            out.append(int(text.split("Sent ", 1)[1].split(" bytes", 1)[0]))
        return tuple(out)

    def launcher_args(self, per_node):
        hosts = ",".join(f"{ns}:{per_node}" for ns in self.nodes)
        return ["-H", hosts, "--ssh-command", "ip netns exec {host} sh -c {command}"]
