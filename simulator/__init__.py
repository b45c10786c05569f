"""The whole-system replay: the product and its peers run on one simulated cluster over a trace.

``trace`` reads usage traces, ``policies`` holds the systems (ours and the peers, each a
compression policy plus a node policy), ``replay`` runs them day by day on a cluster model and
counts violations against real capacity, ``report`` writes the Markdown, plots and
``summary.json``. Every decision comes from ``oversale/`` (the same functions the webhooks, the
reconcilers and the extender call); nothing here imports an adapter.
"""
