"""Several "hosts" on one Linux machine: network namespaces joined by a bridge.

Each host is a namespace with one veth link (``eth0``) to a bridge in the root namespace,
its own loopback, and an address 10.<net>.0.<i+1>/24. Ranks started on a host see only that
link, so weft talks tcp between hosts and shared memory inside one (``WEFT_HOST_ID`` is set
per host). ``rate_mbit`` limits each host's link in both directions with ``tc tbf``, a token
bucket of BURST_BYTES: a link that idled passes that much at once before it holds the rate
(``Topology.from_cost_model(..., nic_burst_bytes=BURST_BYTES)`` simulates such links).

Needs root and ``ip`` (and ``tc`` for a rate); ``unavailable()`` says why not when it can't.
Used by the multi-host tests and the hierarchical benchmark::

    with weft.netns.Hosts(2, rate_mbit=1000) as hosts:
        procs = [hosts.spawn(h, [sys.executable, "job.py", ...]) for h in (0, 0, 1, 1)]
        job = hosts.mpirun(2, [sys.executable, "job.py", ...])   # OpenMPI: 2 ranks per host
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

BURST_BYTES = 256 << 10  # tbf's bucket on each rate-limited link

# Names a Hosts in this process: a namespace's links outlive its deletion for a moment, so the
# next Hosts of the process must not reuse them.
_instances = itertools.count()


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the '{tool}' command is missing (Debian: apt-get install iproute2)"
    probe = f"wftprobe{os.getpid() % 100000}"
    try:
        _run("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"cannot create a network namespace: {e}"
    _run("ip", "netns", "delete", probe)
    return None


class Hosts:
    """``count`` namespaces; a context manager that removes them (and their processes)."""

    def __init__(self, count: int, rate_mbit: float | None = None):
        tag = os.getpid() % 10000 * 100 + next(_instances) % 100
        self.count = count
        self.rate_mbit = rate_mbit
        self.bridge = f"wftbr{tag}"
        self.namespaces = [f"wft{tag}h{i}" for i in range(count)]
        net = 100 + tag % 150
        self.ips = [f"10.{net}.0.{i + 1}" for i in range(count)]
        self._root_links = [f"wft{tag}v{i}" for i in range(count)]
        self._procs: list[subprocess.Popen] = []
        self._files: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> Hosts:
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
            for ns, link, ip in zip(self.namespaces, self._root_links, self.ips):
                _run("ip", "netns", "add", ns)
                _run("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _run("ip", "link", "set", link, "master", self.bridge, "up")
                _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                if self.rate_mbit:
                    self._limit(link, ns)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _limit(self, link: str, ns: str) -> None:
        """tbf on both ends of the host's link: its traffic out and in."""
        rate = f"{self.rate_mbit}mbit"
        tbf = ["tbf", "rate", rate, "burst", str(BURST_BYTES), "latency", "50ms"]
        _run("tc", "qdisc", "add", "dev", link, "root", *tbf)
        _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf)

    def cut(self, host: int) -> None:
        """Takes ``host``'s link down at the bridge: from then on its packets are dropped
        without a reset or an ICMP error either way, as when a host loses power or its cable
        is pulled. Its processes keep running, cut off."""
        _run("ip", "link", "set", self._root_links[host], "down")

    def spawn(self, host: int, argv: list[str], env: dict[str, str] | None = None, **kwargs):
        """Starts ``argv`` on ``host`` with WEFT_HOST_ID set to that host."""
        full_env = dict(os.environ if env is None else env)
        full_env["WEFT_HOST_ID"] = self.namespaces[host]
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[host], *argv], env=full_env, **kwargs
        )
        self._procs.append(proc)
        return proc

    def spawn_world(
        self, per_host: int, argv: list[str], env: dict[str, str], port: int, **kwargs
    ) -> list[subprocess.Popen]:
        """Starts ``argv`` as every rank of a world launched the way torchrun launches one:
        rank r on host r // per_host, with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR (host 0)
        and MASTER_PORT set, and GLOO_SOCKET_IFNAME naming the host's link (not what the
        hostname resolves to)."""
        size = len(self.namespaces) * per_host
        world = dict(env, MASTER_ADDR=self.ips[0], MASTER_PORT=str(port), WORLD_SIZE=str(size))
        world["GLOO_SOCKET_IFNAME"] = "eth0"
        return [
            self.spawn(rank // per_host, argv,
                       dict(world, RANK=str(rank), LOCAL_RANK=str(rank % per_host)), **kwargs)
            for rank in range(size)
        ]  # fmt: skip

    def mpirun(
        self,
        per_host: int,
        argv: list[str],
        env: dict[str, str] | None = None,
        command: str = "mpirun",
        **kwargs,
    ):
        """Starts ``argv`` as ``per_host`` MPI ranks on every host with OpenMPI's ``mpirun``,
        which runs on host 0 and reaches the others through an rsh agent that enters their
        namespace. Every host is an OpenMPI node with its own hostname (a UTS namespace), so
        OpenMPI uses shared memory between ranks of one host and tcp over the link between
        two; WEFT_HOST_ID is set per host, as ``spawn`` does. Placement is left to the kernel
        (``--bind-to none``), as for ranks started with ``spawn``."""
        for tool in (command, "unshare", "hostname"):
            if shutil.which(tool) is None:
                raise RuntimeError(
                    f"Hosts.mpirun needs '{tool}' (Debian: apt-get install openmpi-bin "
                    "util-linux hostname)"
                )
        if self._files is None:
            self._files = tempfile.TemporaryDirectory(prefix="weft-netns-")
        files = Path(tempfile.mkdtemp(dir=self._files.name))  # one per launch
        hostfile, agent = files / "hostfile", files / "agent.sh"
        hostfile.write_text("".join(f"{ip} slots={per_host}\n" for ip in self.ips))
        cases = "".join(f"  {ip}) ns={ns} ;;\n" for ip, ns in zip(self.ips, self.namespaces))
        # The agent gets its command as ssh would: words that a shell joins and parses again
        # (OpenMPI quotes its arguments for that), hence "$*".
        agent.write_text(
            "#!/bin/sh\n# OpenMPI's rsh agent: '<agent> HOST COMMAND...' runs COMMAND on HOST.\n"
            f'case "$1" in\n{cases}  *) echo "no namespace has address $1" >&2; exit 1 ;;\nesac\n'
            'shift\nexec ip netns exec "$ns" unshare --uts \\\n'
            '  sh -c "hostname $ns; export WEFT_HOST_ID=$ns; $*"\n'
        )
        agent.chmod(0o755)
        launch = [command, "--allow-run-as-root", "--hostfile", str(hostfile)]
        launch += ["-np", str(per_host * self.count), "--bind-to", "none"]
        launch += ["--mca", "plm_rsh_agent", str(agent)]
        launch += ["--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp"]
        launch += ["--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0"]
        if per_host * self.count > (os.cpu_count() or 1):
            # The hosts share this machine's CPUs, which OpenMPI cannot see: each host looks
            # uncrowded, so its ranks would spin through whole time slices while they wait. It
            # yields instead, as it does by itself on a node it knows is oversubscribed.
            launch += ["--mca", "mpi_yield_when_idle", "1"]
        host0 = self.namespaces[0]
        in_host0 = ["ip", "netns", "exec", host0, "unshare", "--uts", "sh", "-c"]
        in_host0 += [f'hostname {host0}; export WEFT_HOST_ID={host0}; exec "$0" "$@"']
        proc = subprocess.Popen(
            [*in_host0, *launch, *argv], env=dict(os.environ if env is None else env), **kwargs
        )
        self._procs.append(proc)
        return proc

    def __exit__(self, *exc) -> None:
        try:
            # Everything started in a namespace, however deep (mpirun's daemons and ranks
            # leave its process group), is in that namespace's list.
            for ns in self.namespaces:
                pids = subprocess.run(
                    ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30
                ).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # gone already
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)
        finally:
            for ns in self.namespaces:
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, timeout=30)
            if self._files is not None:
                self._files.cleanup()
