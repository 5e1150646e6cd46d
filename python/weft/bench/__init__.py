"""weft-bench, the bandwidth microbenchmark (``weft-bench``, ``python -m weft.bench``).

cli.py       flags (nccl-tests'), the run: systems x repeats, then the report
lineup.py    which systems run: weft variants (--algo, --transport), peers (--vs)
launch.py    ranks: local processes, mpirun, or an outside launcher's
systems.py   each system's collectives behind one interface, inside a rank
timing.py    the measurement loop every system runs
ops.py       the collectives: counts, buffers, bus factors, expected results
results.py   per-rank timings -> records, ratios
report.py    table, JSON, CSV;  plot.py  the PNG;  progress.py  the bar
"""
