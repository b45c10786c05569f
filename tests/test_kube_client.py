"""How the shared Kubernetes plumbing (kube/client.py) tells an API or connection error in one
line, and where it finds its client: the errors are the ones the ``kubernetes`` client raises for
real failures on loopback, as a log line or an Event shows them."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kube.client import (
    VPA,
    GarbledAnswer,
    api_refusal,
    api_server_of,
    decoded,
    first_few,
    found,
    load_api_client,
    one_line,
    refused_by_server,
    without_managed_fields,
)
from kube.tls import generate
from tests.kube_api import FakeKubeAPI, write_kubeconfig


def failure_of(url: str, timeout: float = 2.0) -> BaseException:
    """What the ``kubernetes`` client raises for a list of Nodes at ``url`` (no retries)."""
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = url
    configuration.retries = 0
    with pytest.raises(urllib3.exceptions.HTTPError) as raised:
        client.CoreV1Api(client.ApiClient(configuration)).list_node(_request_timeout=timeout)
    return raised.value


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def loopback(answer: Callable[[socket.socket], None] | None = None) -> Iterator[int]:
    """The port of a server on loopback that hands each connection, once accepted, to ``answer``
    and then closes it (None: connections are queued and never answered); it stops with the block."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)

        def serve(answer: Callable[[socket.socket], None]) -> None:
            while True:
                try:
                    connection, _ = sock.accept()
                except OSError:
                    return  # the block ended
                with connection, suppress(OSError):  # OSError: the client gave up (on the certificate, say)
                    answer(connection)

        if answer is not None:
            threading.Thread(target=serve, args=(answer,), daemon=True).start()
        yield int(sock.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A server that accepts connections and never answers."""
    with loopback() as port:
        yield port


@pytest.fixture
def untrusted_tls_server(tmp_path: Path) -> Iterator[int]:
    """A TLS server whose certificate no CA the client knows signed."""
    paths = generate(tmp_path, ["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths.cert, paths.key)
    with loopback(lambda connection: context.wrap_socket(connection, server_side=True).close()) as port:
        yield port


def test_a_refused_connection_names_the_host_and_why(closed_port):
    assert one_line(failure_of(f"http://127.0.0.1:{closed_port}")) == \
        f"127.0.0.1:{closed_port} unreachable (connection refused)"


def test_a_server_that_never_answers_is_timed_out(silent_server):
    assert one_line(failure_of(f"http://127.0.0.1:{silent_server}", timeout=0.3)) == \
        f"127.0.0.1:{silent_server} unreachable (timed out)"


def test_a_certificate_no_known_ca_signed_is_said_so(untrusted_tls_server):
    error = failure_of(f"https://127.0.0.1:{untrusted_tls_server}")
    assert one_line(error) == f"127.0.0.1:{untrusted_tls_server} unreachable (its certificate is not trusted)"


def test_a_host_no_name_server_knows_is_said_unknown():
    # .invalid is reserved never to resolve (RFC 6761).
    assert one_line(failure_of("http://no-such-host.invalid:6443")) in {
        "no-such-host.invalid:6443 unreachable (unknown host)",
        "no-such-host.invalid:6443 unreachable (name lookup failed)"}  # a machine with no name server
    # A name server that did not answer, as urllib3 raises it.
    connection = urllib3.connection.HTTPConnection("api.cluster.local", 6443)
    lookup = urllib3.exceptions.NameResolutionError(
        "api.cluster.local", connection, socket.gaierror(-3, "Temporary failure in name resolution"))
    pool = urllib3.HTTPConnectionPool("api.cluster.local", 6443)
    assert one_line(urllib3.exceptions.MaxRetryError(pool, "/api", lookup)) == \
        "api.cluster.local:6443 unreachable (name lookup failed)"
    # macOS's resolver words it otherwise.
    unknown = urllib3.exceptions.NameResolutionError(
        "api.cluster.local", connection, socket.gaierror(8, "nodename nor servname provided, or not known"))
    assert one_line(urllib3.exceptions.MaxRetryError(pool, "/api", unknown)) == \
        "api.cluster.local:6443 unreachable (unknown host)"


def test_other_connection_failures_keep_their_root_cause_in_one_line():
    # No route to host cannot be made on loopback: the error urllib3 raises for it, as it builds it.
    pool = urllib3.HTTPConnectionPool("10.1.2.3", 6443)
    no_route = urllib3.exceptions.NewConnectionError(
        pool, "Failed to establish a new connection: [Errno 113] No route to host")
    assert one_line(urllib3.exceptions.MaxRetryError(pool, "/api", no_route)) == \
        "10.1.2.3:6443 unreachable (no route to host)"
    odd = urllib3.exceptions.NewConnectionError(pool, "Failed to establish a new connection: [Errno 99] "
                                                      "Cannot assign requested address\nmore")
    assert one_line(urllib3.exceptions.MaxRetryError(pool, "/api", odd)) == \
        "10.1.2.3:6443 unreachable (Failed to establish a new connection: [Errno 99] Cannot assign requested address)"
    # An error that names no pool.
    dropped = urllib3.exceptions.ProtocolError("Response ended prematurely")
    assert one_line(dropped) == "the server unreachable (Response ended prematurely)"


@pytest.fixture
def closing_server() -> Iterator[int]:
    """A server (or a proxy before it) that closes each connection before answering."""
    with loopback(lambda connection: connection.recv(65536)) as port:
        yield port


def _reset_halfway(connection: socket.socket) -> None:
    connection.recv(65536)
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                       b'{"items": [')
    # Linger 0: closing sends a reset, not an orderly end.
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.fixture
def resetting_server() -> Iterator[int]:
    """A server that starts its answer and resets the connection halfway through it."""
    with loopback(_reset_halfway) as port:
        yield port


def test_a_connection_reset_halfway_through_the_answer_is_said_dropped(resetting_server):
    assert one_line(failure_of(f"http://127.0.0.1:{resetting_server}")) == "the server unreachable (connection dropped)"


def test_a_connection_closed_before_the_answer_is_said_dropped(closing_server):
    assert one_line(failure_of(f"http://127.0.0.1:{closing_server}")) == \
        f"127.0.0.1:{closing_server} unreachable (connection dropped)"


def test_an_api_refusal_is_its_status_and_the_api_servers_own_words(tmp_path):
    api = FakeKubeAPI().start()
    try:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                                client_configuration=configuration)
        core = client.CoreV1Api(client.ApiClient(configuration))
        with pytest.raises(ApiException) as missing:
            core.read_namespaced_pod("nowhere", "shop")
        api.down = True
        with pytest.raises(ApiException) as down:
            core.list_node()
    finally:
        api.stop()
    said = one_line(missing.value)
    assert said.startswith("HTTP 404 Not Found: ") and len(said) > len("HTTP 404 Not Found: ")
    assert refused_by_server(missing.value) and api_refusal(missing.value) == f"404 {said.split(': ', 1)[1]}"
    # A 5xx leaves open whether the call happened; its words only where asked for.
    assert one_line(down.value) == "HTTP 503 Service Unavailable"
    assert not refused_by_server(down.value)


@pytest.mark.parametrize(("status", "refused"), [(399, False), (400, True), (499, True), (500, False),
                                                  (None, False), ("400", False)])
def test_only_a_4xx_is_a_refusal(status, refused):
    error = ApiException(status=status, reason="Reason")
    assert refused_by_server(error) is refused


@pytest.mark.parametrize(("status", "all_words", "said"), [
    (400, False, "HTTP 400 Bad Request: the words"),
    (499, False, "HTTP 499 Bad Request: the words"),
    (500, False, "HTTP 500 Bad Request"),
    (500, True, "HTTP 500 Bad Request: the words"),
    (399, False, "HTTP 399 Bad Request"),
])
def test_the_api_servers_words_follow_a_refusal_and_a_5xx_only_when_asked(status, all_words, said):
    error = ApiException(status=status, reason="Bad Request")
    error.body = '{"kind": "Status", "message": "the words\\nand a second line"}'
    assert one_line(error, all_words=all_words) == said


def test_first_few_counts_only_the_names_left_out():
    assert first_few(["a", "b", "c"], 3) == "a, b, c"
    assert first_few(["a", "b", "c", "d"], 3) == "a, b, c and 1 more"
    assert first_few([]) == ""
    assert first_few(list("abcdef")) == "a, b, c, d, e and 1 more"


def test_off_means_no_cluster_even_with_a_kubeconfig(tmp_path, monkeypatch):
    api = FakeKubeAPI().start()
    try:
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        assert load_api_client("off") is None
        found = load_api_client("auto")
        assert found is not None and api_server_of(found) == api.url
        assert api_server_of(None) == "?"
    finally:
        api.stop()


def test_a_garbled_answer_with_no_address_or_type_still_says_what_came():
    class Bare:
        data, url, headers = None, None, None

    with pytest.raises(GarbledAnswer) as garbled:
        decoded(Bare())
    assert str(garbled.value) == "the answer to the API server is no Kubernetes object (no Content-Type, 0 bytes)"

    class NoList:
        data, url, headers = b'{"items": {"a": 1}}', "/api/v1/pods?limit=1", {"Content-Type": "application/json"}

    with pytest.raises(GarbledAnswer) as garbled:
        decoded(NoList())
    assert str(garbled.value) == "the answer to /api/v1/pods is no Kubernetes object (application/json, 19 bytes)"


def test_no_kubeconfig_anywhere_means_no_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "none"), "", str(tmp_path / "neither")]))
    assert load_api_client("auto") is None


def test_a_broken_kubeconfig_is_named_with_what_is_wrong(tmp_path, monkeypatch):
    from kubernetes.config import ConfigException

    missing, broken = tmp_path / "missing", tmp_path / "kubeconfig"
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(missing), str(broken)]))
    named = f"kubeconfig {missing}{os.pathsep}{broken}"
    broken.write_text("this is not a kubeconfig\n")
    with pytest.raises(ConfigException) as refused:
        load_api_client("auto")
    assert str(refused.value) == f"{named} is not a valid kubeconfig (TypeError)"
    broken.write_text("apiVersion: v1\nkind: Config\ncurrent-context: gone\ncontexts: []\nclusters: []\n")
    with pytest.raises(ConfigException) as refused:
        load_api_client("auto")
    assert str(refused.value).startswith(f"{named}: ") and "gone" in str(refused.value), refused.value
    assert "\n" not in str(refused.value)


def test_a_refusal_whose_body_holds_no_status_is_its_http_line_alone():
    error = ApiException(status=403, reason="Forbidden")
    error.body = "<html>denied by the proxy</html>"
    assert one_line(error) == "HTTP 403 Forbidden"
    assert api_refusal(error) == "403 Forbidden"


def test_found_reads_an_object_and_none_for_what_the_api_server_has_not(tmp_path):
    from kubernetes import client, config

    api = FakeKubeAPI().start()
    try:
        api.absent = {"verticalpodautoscalers"}
        api.put("pods", {"metadata": {"name": "web", "namespace": "shop", "managedFields": [{"manager": "kubectl"}]},
                         "spec": {"containers": []}})
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                                client_configuration=configuration)
        api_client = client.ApiClient(configuration)
        core = client.CoreV1Api(api_client)
        pod = found(core.read_namespaced_pod, "web", "shop")
        assert pod is not None and pod["metadata"]["name"] == "web" and pod["spec"] == {"containers": []}
        assert without_managed_fields(pod) is pod and "managedFields" not in pod["metadata"]
        assert found(core.read_namespaced_pod, "gone", "shop") is None
        assert found(client.CustomObjectsApi(api_client).list_cluster_custom_object, *VPA) is None  # no CRD
        api.down = True
        with pytest.raises(ApiException) as down:
            found(core.read_namespaced_pod, "web", "shop")
        assert down.value.status == 503
    finally:
        api.stop()


def test_a_read_gives_up_once_its_timeout_passed_and_a_dropped_one_is_tried_again(tmp_path, monkeypatch):
    """urllib3 on its own sends a GET again 3 times after its answer timed out: a lookup given
    1 s took 4 s against an API server that stopped answering, past the 5 s an admission webhook
    is given where the lookup was given 3 s. The clients every adapter loads send it once. A
    connection the server closed before answering is still tried again (a keep-alive connection
    closed while idle)."""
    from kubernetes import client

    with socket.socket() as sock:  # accepts nothing: each connection the client makes waits in its queue
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        port = int(sock.getsockname()[1])
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "silent", f"http://127.0.0.1:{port}")))
        with pytest.raises(urllib3.exceptions.HTTPError) as raised:
            client.CoreV1Api(load_api_client("auto")).read_namespaced_pod("web", "default", _request_timeout=0.3)
        assert one_line(raised.value) == f"127.0.0.1:{port} unreachable (timed out)"
        sock.setblocking(False)
        made = 0
        with suppress(BlockingIOError):
            while True:
                sock.accept()[0].close()
                made += 1
        assert made == 1, f"the read was sent {made} times"

    answered: list[int] = []
    with loopback(lambda connection: answered.append(len(connection.recv(65536)))) as port:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "closing", f"http://127.0.0.1:{port}")))
        with pytest.raises(urllib3.exceptions.HTTPError) as raised:
            client.CoreV1Api(load_api_client("auto")).read_namespaced_pod("web", "default", _request_timeout=2)
        assert one_line(raised.value) == f"127.0.0.1:{port} unreachable (connection dropped)"
        assert len(answered) == 4, "sent once and tried 3 times again"
