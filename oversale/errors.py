"""The few named errors of the core; adapters catch them and turn them into warnings and metrics."""


class OversaleError(Exception):
    """Base class of every error the core raises on bad input."""


class QuantityError(OversaleError, ValueError):
    """A string is not a valid Kubernetes resource quantity."""


class InvalidRatio(OversaleError, ValueError):
    """An annotation that should hold a ratio holds something else."""


class InvalidAnnotation(OversaleError, ValueError):
    """An annotation of ours holds a value outside its vocabulary."""


class SettingsError(OversaleError, ValueError):
    """An environment variable holds a value the service cannot run with."""
