"""oversale's pure domain core.

Everything in this package is plain functions over plain data (dicts as the Kubernetes API
serialises them, dataclasses, ints and Decimals). Nothing here does I/O: the HTTP webhook,
the reconcilers, the scheduler extender and the certificate tools are adapters around it.
"""
