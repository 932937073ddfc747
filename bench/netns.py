"""Two fake nodes joined by a shaped link, for the hierarchical-vs-flat benchmark.

    with TwoNodes(rate="1gbit") as net:      # needs root and iproute2 (ip, tc)
        net.launcher_args()                  # horovodlikerun -H ... --ssh-command ...

Each node is a network namespace with a veth into a bridge in the root namespace; each
namespace's egress is shaped with tc's token bucket to `rate`. Ranks are started inside
the namespaces by horovodlikerun's remote-command template (`ip netns exec {host} ...`),
so they see only their own node's loopback and the shaped link. All addresses are the
test's own, on the link it made; everything is removed on exit.

Every name (namespaces, bridge, veths) starts with `prefix` and the link uses `subnet`:
two users at once (a test and a benchmark) must pick different ones, or the second
one's set-up removes the first one's namespaces.
"""
import shutil
import subprocess

SUBNET = "10.231.77"
BRIDGE = "hvdl-br"


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
    def __init__(self, rate="1gbit", prefix="hvdl", subnet=SUBNET):
        assert len(prefix) <= 10, "interface names are at most 15 characters"
        self.rate, self.prefix, self.subnet = rate, prefix, subnet
        self.nodes = (f"{prefix}-n1", f"{prefix}-n2")
        self.bridge = BRIDGE if prefix == "hvdl" else f"{prefix}-br"

    def __enter__(self):
        self.__exit__()
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, ns in enumerate(self.nodes, start=1):
            inside, outside = f"{self.prefix}-p{i}", f"{self.prefix}-v{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", ns)
            sh("ip", "link", "set", outside, "master", self.bridge)
            sh("ip", "link", "set", outside, "up")
            run = ("ip", "netns", "exec", ns)
            sh(*run, "ip", "addr", "add", f"{self.subnet}.{10 + i}/24", "dev", inside)
            sh(*run, "ip", "link", "set", inside, "up")
            sh(*run, "ip", "link", "set", "lo", "up")
            sh(*run, "tc", "qdisc", "add", "dev", inside, "root", "tbf", "rate", self.rate,
               "burst", "256kb", "latency", "50ms")
        return self

    def __exit__(self, *exc):
        for ns in self.nodes:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    def env(self):
        return {"HOROVODLIKE_STORE_HOST": f"{self.subnet}.1"}

    def launcher_args(self, per_node):
        hosts = ",".join(f"{ns}:{per_node}" for ns in self.nodes)
        return ["-H", hosts, "--ssh-command", "ip netns exec {host} sh -c {command}"]
