"""The cost model on a world no machine here has: python examples/topo_predict.py"""

from weft import topo

world = topo.Topology(size=1024, hosts=128)  # 8 ranks per host, tcp between hosts
family, seconds = topo.choose("allreduce", 64 << 20, world)  # the tuner's pick for 64 MiB
costs = {a: topo.predict(a, "allreduce", 8, world) for a in topo.algorithms_for("allreduce", world)}
model = topo.CostModel()
model.tcp = topo.LinkCost(alpha_s=5e-6, beta_s_per_b=1 / 12.5e9)  # a 100 Gbit/s network
faster = topo.choose("allreduce", 64 << 20, world, model)

print(f"64 MiB on {world.size} ranks: {family}, {seconds * 1e3:.1f} ms")
print("8 B:", {a: f"{s * 1e6:.1f} us" for a, s in sorted(costs.items(), key=lambda kv: kv[1])})
print(f"64 MiB at 100 Gbit/s: {faster[0]}, {faster[1] * 1e3:.1f} ms")
assert family in costs and seconds > faster[1] > 0
