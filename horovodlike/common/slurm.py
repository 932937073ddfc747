"""What Slurm tells a process: host lists, tasks per node, and who a task of `srun` is.

Slurm names hosts in compressed lists (``node[01-03,07],gpu7``) and counts tasks per node
compressed too (``2(x3),1``: three nodes of 2, then one of 1). ``scontrol show
hostnames`` expands the first; this module does both without running anything, so a
task needs nothing but its environment.

A task of ``srun`` (a job step) has SLURM_STEP_ID, SLURM_PROCID (its rank),
SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NODELIST and
SLURM_STEP_TASKS_PER_NODE. A batch script or an ``salloc`` shell has SLURM_PROCID=0 and
SLURM_NTASKS of the whole allocation too, but no SLURM_STEP_ID: it is not one of the
job's ranks, and a plain ``python train.py`` there is a job of one.
"""
import re

MAX_HOSTS = 65536      # more nodes than any allocation has; bounds what a range expands to

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top(text):
    """Split on commas outside brackets: 'a[1,2],b' -> ['a[1,2]', 'b']."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"host list {text!r}: ']' without '['")
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return [p for p in (s.strip() for s in parts) if p]


def _expand_one(item, limit):
    """'node[01-03]x' -> ['node01x', 'node02x', 'node03x'] (several brackets multiply)."""
    m = re.search(r"\[([^\[\]]*)\]", item)
    if m is None:
        if "[" in item or "]" in item:
            raise ValueError(f"host list entry {item!r} has unbalanced brackets")
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    out = []
    for rng in m.group(1).split(","):
        r = _RANGE.match(rng.strip())
        if r is None:
            raise ValueError(f"host list entry {item!r}: {rng!r} is not N or N-M")
        lo, hi = r.group(1), r.group(2) or r.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"host list entry {item!r}: range {rng!r} runs backwards")
        if int(hi) - int(lo) + len(out) >= limit:
            raise ValueError(f"host list entry {item!r} names more than {limit} hosts")
        width = len(lo)       # node[01-10]: leading zeros keep the width
        for n in range(int(lo), int(hi) + 1):
            for rest in _expand_one(tail, limit - len(out)):
                out.append(f"{head}{n:0{width}d}{rest}")
    return out


def expand_hostlist(text, limit=MAX_HOSTS):
    """Slurm's compressed host list as a list of names, in order."""
    hosts = []
    for item in _split_top(text or ""):
        hosts.extend(_expand_one(item, limit - len(hosts)))
        if len(hosts) > limit:
            raise ValueError(f"host list {text!r} names more than {limit} hosts")
    if not hosts:
        raise ValueError(f"host list {text!r} names no host")
    return hosts


def expand_counts(text, limit=MAX_HOSTS):
    """'2(x3),1' -> [2, 2, 2, 1]: Slurm's tasks (or CPUs) per node."""
    out = []
    for item in (s.strip() for s in (text or "").split(",")):
        m = _COUNT.match(item)
        if m is None:
            raise ValueError(f"tasks per node {text!r}: {item!r} is not N or N(xM)")
        repeat = int(m.group(2) or 1)
        if repeat < 1 or len(out) + repeat > limit:
            raise ValueError(f"tasks per node {text!r}: bad repeat in {item!r}")
        out.extend([int(m.group(1))] * repeat)
    return out


def _int(env, name):
    value = env.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def step_task(env):
    """(rank, size, local_rank, local_size, node, nodes, first_host) of a task of srun,
    or None when this process is not one (no SLURM_STEP_ID: a batch script, an salloc
    shell, or no Slurm at all). first_host is the first host of the step, where task 0
    runs. Raises ValueError for a step environment that does not add up."""
    if env.get("SLURM_STEP_ID") in (None, "") or env.get("SLURM_PROCID") in (None, ""):
        return None
    rank = _int(env, "SLURM_PROCID")
    size = _int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS")
    if size is None or not 0 <= rank < size:
        raise ValueError(f"srun task: SLURM_PROCID={rank} of SLURM_STEP_NUM_TASKS={size}")
    hosts = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST"))
    node = _int(env, "SLURM_NODEID") or 0
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    counts = expand_counts(per_node) if per_node else None
    local_size = counts[node] if counts and node < len(counts) else None
    local_rank = _int(env, "SLURM_LOCALID")
    return rank, size, local_rank, local_size, node, len(hosts), hosts[0]


def allocation_hosts(env):
    """[(host, slots)] of the allocation this process runs in (SLURM_JOB_NODELIST, with
    SLURM_NTASKS_PER_NODE or else SLURM_TASKS_PER_NODE as the slots), or None outside
    one. Raises ValueError for lists that do not match."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist or env.get("SLURM_JOB_ID") in (None, ""):
        return None
    hosts = expand_hostlist(nodelist)
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    if per_node:
        counts = [int(per_node)] * len(hosts) if per_node.isdigit() else \
            expand_counts(per_node)
    else:
        counts = expand_counts(env.get("SLURM_TASKS_PER_NODE") or
                               env.get("SLURM_JOB_CPUS_PER_NODE") or "1")
    if len(counts) != len(hosts):
        raise ValueError(f"the Slurm allocation lists {len(hosts)} host(s) "
                         f"(SLURM_JOB_NODELIST={nodelist}) but tasks for {len(counts)}")
    return list(zip(hosts, counts))
