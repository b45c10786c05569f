"""What every entry point does with an error it cannot handle: one line that names the thing and
what to do, and exit code 2, never a traceback (``--debug`` shows it).

Each ``__main__`` ends with ``sys.exit(run_cli(main))``; ``main`` itself raises freely.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from kube.client import GarbledAnswer, answered, api_server_of, decoded, load_api_client, one_line
from oversale.errors import SettingsError
from oversale.settings import Settings, unread_variables

DEBUG_HELP = "show the traceback of an unexpected error instead of one line"


class CliError(Exception):
    """A problem the user can fix, already told in one line (exit code 2)."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors told in one line (argparse prints the whole usage first, which
    buries the one line that says what is wrong); exit code 2 as argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists every option)\n")


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """Show ``--debug`` in ``--help``; ``run_cli`` takes it out of argv wherever it stands."""
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)


def settings_or_exit(parser: argparse.ArgumentParser) -> Settings:
    """The Settings from the environment with logging set up from them; a bad setting is a usage
    error of this command (one line, exit code 2), told before anything starts."""
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as error:
        parser.error(str(error))
    # stderr explicitly: `plan` and `once --dry-run` print their tables on stdout.
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for warning in unread_variables(os.environ):
        logging.getLogger("oversale.settings").warning("%s", warning)
    return settings


def describe(error: BaseException) -> str:
    """The one line for an error an entry point met; a hint says what to do where one is known."""
    import urllib3
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException

    if isinstance(error, CliError):
        return str(error)
    if isinstance(error, ConfigException):
        return f"{one_line(error)} (fix it, or point KUBECONFIG at a working one)"
    if isinstance(error, urllib3.exceptions.HTTPError):
        return (f"cannot reach the API server: {one_line(error)}; check KUBECONFIG and its current context "
                "(kubectl cluster-info)")
    if isinstance(error, GarbledAnswer):
        return f"{error}: is the server in KUBECONFIG a Kubernetes API server? (kubectl cluster-info)"
    if isinstance(error, ApiException):
        return f"the API server refused the request: {one_line(error, all_words=True)}"
    if isinstance(error, FileNotFoundError):
        return f"{error.filename or error}: no such file or directory"
    if isinstance(error, PermissionError):
        return f"{error.filename or error}: permission denied"
    if isinstance(error, OSError) and error.filename:
        return f"{error.filename}: {error.strerror or one_line(error)}"
    return f"{type(error).__name__}: {one_line(error)}"


def run_cli(main: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main`` with ``--debug`` taken out; an error becomes ``error: ...`` on stderr and 2."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in arguments
    arguments = [a for a in arguments if a != "--debug"]
    if not debug:
        # urllib3 logs each retry of a refused connection with its pool internals; the one line
        # below says the same once.
        logging.getLogger("urllib3").setLevel(logging.ERROR)
    try:
        return main(arguments)
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        if debug:
            raise
        hint = "" if isinstance(error, CliError) else " (--debug shows the traceback)"
        print(f"error: {describe(error)}{hint}", file=sys.stderr)
        return 2


def bind_address(text: str) -> str:
    """argparse type of ``--bind``: HOST:PORT with a port in 0..65535, 0 for any free one (gunicorn
    would otherwise take "8443" as a host and retry it five times)."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (for example 127.0.0.1:8443 or 0.0.0.0:8443)")
    return text


def required_api_client(mode: str, needs: str) -> Any:
    """The API client of :func:`kube.client.load_api_client`; CliError when there is none, saying
    what ``needs`` it (e.g. "the extender needs")."""
    api_client = load_api_client(mode)
    if api_client is None:
        raise CliError(f"no in-cluster config and no kubeconfig: {needs} an API server "
                       "(set KUBECONFIG or run inside the cluster)")
    return api_client


def check_api_server(api_client: object, timeout: float = 5.0) -> str:
    """GET /version once, so a dead kubeconfig fails at start with one line instead of a
    not-ready server that logs a traceback per retry; returns the server's address and version.
    An answer that names no Kubernetes version (a proxy's sign-in page) is a GarbledAnswer: the
    client's own reading of it fails with a validation error that names neither."""
    from kubernetes import client

    response: Any = client.VersionApi(api_client).get_code(_preload_content=False, _request_timeout=timeout)
    version = decoded(response).get("gitVersion")
    if not isinstance(version, str) or not version:
        raise GarbledAnswer(f"the answer to {answered(response)[0]} names no Kubernetes version")
    return f"{api_server_of(api_client)} (Kubernetes {version})"
