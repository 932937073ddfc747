"""Two fake nodes joined by a shaped link, for the hierarchical-vs-flat benchmark.

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
    def __init__(self, rate="1gbit", nodes=("hvdl-n1", "hvdl-n2")):
        self.rate, self.nodes = rate, nodes

    def __enter__(self):
        self.__exit__()
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i, ns in enumerate(self.nodes, start=1):
            inside, outside = f"hvdl-p{i}", f"hvdl-v{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", ns)
            sh("ip", "link", "set", outside, "master", BRIDGE)
            sh("ip", "link", "set", outside, "up")
            run = ("ip", "netns", "exec", ns)
            sh(*run, "ip", "addr", "add", f"{SUBNET}.{10 + i}/24", "dev", inside)
            sh(*run, "ip", "link", "set", inside, "up")
            sh(*run, "ip", "link", "set", "lo", "up")
            sh(*run, "tc", "qdisc", "add", "dev", inside, "root", "tbf", "rate", self.rate,
               "burst", "256kb", "latency", "50ms")
        return self

    def __exit__(self, *exc):
        for ns in self.nodes:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)

    def env(self):
        # Ranks on one node reach each other over loopback (engine/handshake.c) while a
        # multi-host rank listens only on its advertised address (common/bootstrap.py),
        # so with two ranks per namespace they cannot connect. Listening on every
        # interface of the namespace (its loopback and its end of the link) avoids that.
        return {"HOROVODLIKE_STORE_HOST": f"{SUBNET}.1", "HOROVODLIKE_BIND_ADDR": "0.0.0.0"}

    def launcher_args(self, per_node):
        hosts = ",".join(f"{ns}:{per_node}" for ns in self.nodes)
        return ["-H", hosts, "--ssh-command", "ip netns exec {host} sh -c {command}"]
