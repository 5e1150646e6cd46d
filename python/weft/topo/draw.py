"""Pictures (matplotlib): a topology, a simulated Plan's link use over time, and predicted against
measured time per size.

>>> from weft import topo
>>> topo.draw_topology(topo.Topology.hosts(2, 4), "hosts.png")
>>> topo.draw_timeline(topo.builtin("allreduce", "ring", 4, count=1 << 16), topo.Topology.ring(4),
...                    "ring.png")
>>> topo.draw_prediction([(65536, 1.1e-4, 1.2e-4), ...], "fit.png")
"""

from __future__ import annotations

from weft.topo.simulate import simulate

CLASS_COLOUR = {"nvlink": "tab:green", "pcie": "tab:olive", "nic": "tab:blue", "link": "tab:gray"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def layout(topology) -> list[tuple[float, float]]:
    """A position per node: ranks evenly along the bottom row, every other node as many rows up
    as it is links from the nearest rank, above the mean of its neighbours a row down (spread
    evenly where two would meet); a ring or torus, all ranks, on a circle."""
    import math
    from collections import deque

    nodes, links = topology.nodes, topology.links
    n = len(nodes)
    if all(k == "rank" for _, k, _ in nodes):
        return [(math.cos(2 * math.pi * i / n), math.sin(2 * math.pi * i / n)) for i in range(n)]
    neighbours = [[] for _ in nodes]
    for link in links:
        neighbours[link.a].append(link.b)
        neighbours[link.b].append(link.a)
    row = [-1] * n
    x = [0.0] * n
    queue = deque()
    for r, node in enumerate(topology.rank_nodes):
        row[node], x[node] = 0, float(r)
        queue.append(node)
    while queue:
        u = queue.popleft()
        for v in neighbours[u]:
            if row[v] < 0:
                row[v] = row[u] + 1
                queue.append(v)
    for level in range(1, max(row) + 1):
        members = [i for i in range(n) if row[i] == level]
        for i in members:
            below = [x[j] for j in neighbours[i] if row[j] == level - 1]
            x[i] = sum(below) / len(below) if below else 0.0
        members.sort(key=lambda i: (x[i], i))
        spots = [x[i] for i in members]
        if len(set(round(v, 6) for v in spots)) < len(spots):  # some would meet: spread them
            width = max(len(topology.rank_nodes) - 1, 1)
            for k, i in enumerate(members):
                x[i] = width * (k + 0.5) / len(members)
    return [(x[i], float(max(row[i], 0))) for i in range(n)]


def draw_topology(topology, path, *, labels: bool | None = None) -> None:
    """The topology's nodes (ranks, NICs, switches) and links, coloured by class."""
    plt = _pyplot()
    pos = layout(topology)
    fig, ax = plt.subplots(figsize=(min(16, 4 + 0.25 * topology.size), 5))
    for link in topology.links:
        (xa, ya), (xb, yb) = pos[link.a], pos[link.b]
        ax.plot([xa, xb], [ya, yb], color=CLASS_COLOUR.get(link.cls, "black"), lw=0.8, zorder=1)
    marker = {"rank": "o", "nic": "s", "switch": "D"}
    for kind in marker:
        pts = [pos[i] for i, (_, k, _) in enumerate(topology.nodes) if k == kind]
        if pts:
            ax.scatter(*zip(*pts), marker=marker[kind], s=30, label=kind, zorder=2)
    if labels if labels is not None else len(topology.nodes) <= 40:
        for i, (name, _, _) in enumerate(topology.nodes):
            ax.annotate(name, pos[i], fontsize=6, xytext=(3, 3), textcoords="offset points")
    classes = sorted({link.cls for link in topology.links})
    for cls in classes:
        ax.plot([], [], color=CLASS_COLOUR.get(cls, "black"), label=f"{cls} link")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_axis_off()
    ax.set_title(
        f"{topology.name}: {topology.size} ranks, {len(topology.nodes)} nodes, "
        f"{len(topology.links)} links"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_timeline(
    algo, topology, path, nbytes: int | None = None, *, limit: int = 20000, **options
):
    """Simulates ``algo`` (an Algorithm or a built-in family) and draws when each link carried
    which rank's messages: a row per link direction used, a bar per message (the first
    ``limit``). Returns the SimResult."""
    plt = _pyplot()
    result = simulate(algo, topology, nbytes, trace_limit=limit, **options)
    hops = sorted({h for h, _, _, _ in result.trace})
    row = {h: i for i, h in enumerate(hops)}
    fig, ax = plt.subplots(figsize=(10, max(3, 0.25 * len(hops) + 1.5)))
    cmap = plt.get_cmap("tab20")
    for h, rank, start, end in result.trace:
        ax.barh(row[h], (end - start) * 1e6, left=start * 1e6, height=0.8, color=cmap(rank % 20))
    nodes, links = topology.nodes, topology.links

    def name(h):
        link = links[h >> 1]
        a, b = (link.b, link.a) if h & 1 else (link.a, link.b)
        return f"{nodes[a][0]}>{nodes[b][0]}"

    ax.set_yticks(range(len(hops)), [name(h) for h in hops], fontsize=6)
    ax.set_xlabel("simulated time (us); colour: sending rank")
    ax.set_title(
        f"{result.algorithm} {result.collective}, {result.nbytes} B on {topology.name}: "
        f"{result.time_s * 1e6:.1f} us"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return result


def draw_prediction(points, path, *, title: str = "predicted against measured") -> None:
    """``points``: (bytes, predicted_s, measured_s) per size; time per size on log axes, with the
    error of each prediction."""
    plt = _pyplot()
    points = sorted(points)
    sizes = [p[0] for p in points]
    fig, (ax, ax_err) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(3, 1))
    ax.loglog(sizes, [p[2] * 1e6 for p in points], "o-", label="measured")
    ax.loglog(sizes, [p[1] * 1e6 for p in points], "x--", label="predicted")
    ax.set_ylabel("time (us)")
    ax.legend()
    ax.set_title(title)
    ax_err.semilogx(sizes, [100 * (p[1] - p[2]) / p[2] for p in points], "o-")
    ax_err.axhspan(-15, 15, color="tab:green", alpha=0.15)
    ax_err.set_ylabel("error (%)")
    ax_err.set_xlabel("bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
