"""A kube-scheduler extender (filter, prioritize, bind) for oversold nodes with NUMA-aware
exclusive CPU binding. Served by ``python -m scheduler``; decisions in ``oversale.cpus``."""
