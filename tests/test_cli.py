"""Every entry point answers a bad input with one line that names it, and exit code 2.

Each case runs the real command in a subprocess, as a user would, against a kubeconfig whose
API server is a closed port on 127.0.0.1 (connection refused), a kubeconfig that is not YAML, a
missing file or a malformed argument; the few rules of kube/cli.py that no command reaches here
(a port past 65535, a file it may not read) are checked on the functions themselves.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kube.cli import bind_address, run_cli
from tests.conftest import ROOT, SHARED, damage_sqlite, free_port, sigint_as_in_a_terminal
from tests.kube_api import FakeKubeAPI

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: gone
  cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}
users:
- name: someone
  user: {{token: not-a-real-token}}
contexts:
- name: gone
  context: {{cluster: gone, user: someone}}
current-context: gone
"""


@pytest.fixture()
def dead_kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(port=free_port()))  # nothing listens there: connection refused
    return path


def command_env(kubeconfig: Path | None = None, **env: str) -> dict[str, str]:
    """The environment of a command under test: none of our settings but ``env``, and ``kubeconfig``
    (by default one that does not exist)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "OVERSALE_"))}
    environment.update(env)
    environment["KUBECONFIG"] = str(kubeconfig) if kubeconfig else "/nonexistent/kubeconfig"
    return environment


def run(args: list[str], kubeconfig: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=command_env(kubeconfig, **env),
                          capture_output=True, text=True, timeout=90)


def assert_one_clean_line(result: subprocess.CompletedProcess[str], *names: str) -> str:
    lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "urllib3" not in result.stderr and "Retry(" not in result.stderr, \
        result.stderr
    assert len(lines) == 1, result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [
    ["reconcilers", "once", "--dry-run"],
    ["reconcilers", "remediate", "--dry-run"],
    ["certs", "ensure", "--secret", "oversale/oversale-webhook-tls", "--service", "oversale-webhook"],
    ["certs", "inject", "--webhook", "oversale", "--secret", "oversale/oversale-webhook-tls"],
    ["scheduler", "--bind", "127.0.0.1:0"],
])
def test_an_unreachable_api_server_is_one_line(command, dead_kubeconfig):
    line = assert_one_clean_line(run(command, dead_kubeconfig), "cannot reach the API server", "127.0.0.1:",
                                 "connection refused", "KUBECONFIG")
    assert line.startswith("error: ")


@pytest.mark.parametrize(("command", "who"), [
    (["reconcilers", "once", "--dry-run"], "the reconcilers need"),
    (["reconcilers", "remediate"], "the reconcilers need"),
    (["certs", "ensure", "--secret", "oversale/oversale-webhook-tls", "--service", "oversale-webhook"], "ensure needs"),
    (["certs", "inject", "--webhook", "oversale", "--secret", "oversale/oversale-webhook-tls"], "inject needs"),
    (["certs", "restart-on-change", "--secret", "oversale/tls", "--restart", "kube-system/kube-scheduler"],
     "restart-on-change needs"),
    (["scheduler", "--bind", "127.0.0.1:0"], "the extender needs"),
])
def test_no_cluster_at_all_is_one_line_that_says_what_needs_one(command, who):
    # KUBECONFIG names no file and no in-cluster service account is mounted here.
    line = assert_one_clean_line(run(command), "no in-cluster config and no kubeconfig", who, "set KUBECONFIG")
    assert line.startswith("error: ")


def test_a_misspelt_setting_is_named_at_start_not_silently_left_at_its_default(dead_kubeconfig):
    result = run(["reconcilers", "once", "--dry-run"], dead_kubeconfig, OVERSALE_CPU_HOT_TIME_BUGDET="0.0005",
                 OVERSALE_MAX_RATIO="4")
    assert "WARNING oversale.settings: OVERSALE_CPU_HOT_TIME_BUGDET is not a setting; ignored (did you mean " \
           "OVERSALE_CPU_HOT_TIME_BUDGET?)" in result.stderr
    assert "OVERSALE_MAX_RATIO" not in result.stderr, "a setting it reads is not warned about"
    assert_one_clean_line(result, "cannot reach the API server")


def test_the_webhook_names_the_dead_cluster_and_how_to_serve_without_one(dead_kubeconfig, tmp_path):
    result = run(["webhook", "--bind", "127.0.0.1:0", "--certs-dir", str(tmp_path / "certs")], dead_kubeconfig)
    assert_one_clean_line(result, "unreachable", "connection refused", "OVERSALE_KUBERNETES=off")


@pytest.mark.parametrize("command", [
    ["reconcilers", "once", "--dry-run"],
    ["reconcilers", "remediate", "--dry-run"],
    ["scheduler", "--bind", "127.0.0.1:0"],
    ["webhook", "--bind", "127.0.0.1:0"],
])
@pytest.mark.parametrize(("answer", "said"), [
    ("sign-in page", "the answer to /version/ is no Kubernetes object (text/html, 45 bytes)"),
    ({"status": "ok"}, "the answer to /version/ names no Kubernetes version"),  # another JSON service
])
def test_a_kubeconfig_pointing_at_no_api_server_is_one_line(command, answer, said, tmp_path):
    """Its server answers a sign-in page (a proxy, a dashboard's URL pasted in): the start said
    ``ValidationError: 1 validation error for VersionInfo``, naming neither the call nor the answer."""
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        if isinstance(answer, dict):
            api.version = answer
        else:
            api.garbled.add("version")
        result = run([*command, *(["--certs-dir", str(tmp_path)] if command[0] == "webhook" else [])], kubeconfig)
        line = assert_one_clean_line(result, said)
        assert "ValidationError" not in result.stderr
        assert "Kubernetes API server?" in line or "OVERSALE_KUBERNETES=off" in line, line
    finally:
        api.stop()


def test_debug_shows_the_traceback(dead_kubeconfig):
    result = run(["reconcilers", "once", "--dry-run", "--debug"], dead_kubeconfig)
    assert result.returncode != 0 and "Traceback" in result.stderr


@pytest.mark.shared
def test_ctrl_c_on_a_backtest_exits_130_quietly_and_writes_no_report(tmp_path):
    """A month's replay takes minutes; Ctrl-C while it reads the trace is the user's own choice:
    exit code 130 as a shell gives it, no traceback and no error line, and no half-written report."""
    trace = SHARED / "traces" / "bitbrains-rnd-2013-07" / "rnd_2013-07_cpu_mem.csv.gz"
    backtest = subprocess.Popen([sys.executable, "-m", "reconcilers", "backtest", "--trace", str(trace), "--out",
                                 str(tmp_path / "report")], cwd=ROOT, env=command_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_in_a_terminal)
    try:
        assert "read 500,000 rows" in backtest.stderr.readline(), "the replay is under way, reading the trace"
        backtest.send_signal(signal.SIGINT)
        stdout, stderr = backtest.communicate(timeout=60)
    finally:
        backtest.kill()
    assert backtest.returncode == 130, stderr
    assert "Traceback" not in stderr and "error" not in stderr.lower(), stderr
    assert stdout == "" and not (tmp_path / "report").exists(), "no report, and none named"


@pytest.mark.parametrize("address", ["127.0.0.1:8443", "0.0.0.0:65535", "[::1]:8443", "localhost:0"])
def test_bind_takes_any_host_and_a_port_up_to_65535(address):
    assert bind_address(address) == address


@pytest.mark.parametrize("address", [":8443", "127.0.0.1:", "127.0.0.1:https", "127.0.0.1:65536", "127.0.0.1:-1"])
def test_bind_without_a_host_or_a_port_it_can_take_is_named(address):
    with pytest.raises(argparse.ArgumentTypeError, match=rf"^{re.escape(repr(address))} is not HOST:PORT"):
        bind_address(address)


@pytest.mark.parametrize(("error", "said"), [
    (PermissionError(13, "Permission denied", "/var/lib/oversale/history.db"),
     "/var/lib/oversale/history.db: permission denied"),
    (IsADirectoryError(21, "Is a directory", "/var/lib/oversale"), "/var/lib/oversale: Is a directory"),
    (FileNotFoundError(2, "No such file or directory", "trace.csv"), "trace.csv: no such file or directory"),
    (ValueError("could not convert string to float: 'x'"), "ValueError: could not convert string to float: 'x'"),
])
def test_an_unexpected_error_is_one_line_naming_its_file_or_its_kind(error, said, capsys):
    def main(arguments: list[str]) -> int:
        raise error

    assert run_cli(main, []) == 2
    assert capsys.readouterr().err == f"error: {said} (--debug shows the traceback)\n"


def test_a_kubeconfig_that_is_not_one_is_named(tmp_path):
    broken = tmp_path / "kubeconfig"
    broken.write_text("this is not a kubeconfig\n")
    assert_one_clean_line(run(["reconcilers", "once", "--dry-run"], broken), str(broken), "not a valid kubeconfig")


@pytest.mark.parametrize(("command", "names"), [
    (["webhook", "--bind", "8443", "--certs-dir", "/tmp"], ["--bind", "'8443' is not HOST:PORT"]),
    (["webhook", "--workers", "0", "--certs-dir", "/proc/none"], ["--workers must be at least 1"]),
    (["webhook", "--threads", "0", "--certs-dir", "/proc/none"], ["--threads must be at least 1"]),
    (["scheduler", "--bind", "localhost"], ["--bind", "not HOST:PORT"]),
    (["scheduler", "--bind", "127.0.0.1:1", "--certs-dir", "/nonexistent"],
     ["--certs-dir /nonexistent: no tls.crt and tls.key (python -m certs generate writes them)"]),
    (["certs", "ensure", "--secret", "oversale-webhook-tls", "--service", "x"], ["NAMESPACE/NAME"]),
    (["certs", "inject", "--webhook", "x", "--ca-file", "/nonexistent/ca.crt"], ["/nonexistent/ca.crt",
                                                                                 "no such file"]),
    # A file that is no CA is named before the cluster is looked for (there is none here).
    (["certs", "inject", "--webhook", "x", "--ca-file", "pyproject.toml"], ["pyproject.toml",
                                                                            "holds no PEM CA certificate"]),
    (["certs", "generate", "--dir", "/proc/oversale-nope", "--host", "localhost"], ["/proc/oversale-nope"]),
    (["reconcilers", "backtest", "--trace", "/nonexistent/trace.csv"], ["/nonexistent/trace.csv", "no such file"]),
    (["reconcilers", "backtest", "--trace", "/", "--format", "generic"], ["/: a directory, not a trace file",
                                                                        "only bitbrains-raw reads a directory"]),
    (["reconcilers", "backtest", "--trace", "x.csv", "--node-cores", "nan"], ["--node-cores nan", "positive"]),
    (["reconcilers", "backtest", "--trace", "x.csv", "--vm-cores", "inf"], ["--vm-cores inf", "positive"]),
    (["reconcilers", "backtest", "--trace", "x.csv", "--arrival-seed", "-1"], ["--arrival-seed -1"]),
    (["reconcilers", "backtest", "--trace", "x.csv", "--node-memory=-1Gi"], ["--node-memory -1Gi", "above 0"]),
    (["reconcilers", "backtest", "--trace", "x.csv", "--window-days", "0"], ["--window-days 0", "at least 1 day"]),
    (["simulator.tune", "--trace", "x.csv", "--holdout-days", "-1"], ["--holdout-days -1", "at least 0 days"]),
    (["reconcilers", "backtest", "--trace", "x.csv", "--placements", "0"], ["--placements 0", "at least 1"]),
    (["simulator.tune", "--trace", "x.csv", "--placements", "-1"], ["--placements -1", "at least 1"]),
    # Told before the replay, not after minutes of it.
    (["simulator.tune", "--trace", "x.csv", "--json", "/"], ["--json /: not a file that can be written"]),
    (["simulator.budget_check", "--trace", "x.csv", "--json", "/nonexistent/out.json"],
     ["--json /nonexistent/out.json: not a file that can be written"]),
    # As OVERSALE_CPU_HOT_TIME_BUDGET and a node's annotation read it: a percent sign is refused.
    (["reconcilers", "backtest", "--trace", "x.csv", "--hot-time-budget", "0.1%"],
     ["--hot-time-budget: '0.1%'", "share of node-time from 0 to 1"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--hot-time-budget", "2"],
     ["--hot-time-budget: '2'", "share of node-time from 0 to 1"]),
    # Told before the replay, which takes minutes on a month's trace, not after it.
    (["reconcilers", "backtest", "--trace", "x.csv", "--out", "/proc/version"], ["--out /proc/version",
                                                                                  "a file, not a directory"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--out", "/proc/version"], ["--out /proc/version"]),
    (["reconcilers", "plan", "--prometheus", "prometheus:9090"], ["--prometheus 'prometheus:9090'", "http://"]),
    # Told before the bench spends minutes building its history.
    (["bench.reconcile_scale", "--concurrency", "4,x"], ["--concurrency", "'4,x'", "comma-separated"]),
    (["bench.reconcile_scale", "--concurrency", "0"], ["--concurrency", "at least 1"]),
    (["bench.reconcile_scale", "--rounds", "0"], ["--rounds", "at least 1"]),
    (["reconcilers", "plan", "--prometheus", "ftp://prometheus"], ["--prometheus 'ftp://prometheus'", "http://"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--warmup-days", "0", "--days", "3"],
     ["--warmup-days 0", "at least 1 day"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--days", "7"], ["--days 7 must exceed"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--placements", "0"],
     ["--placements 0", "at least 1"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--days", "nan"], ["--days nan: a number of days"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--days", "inf"], ["--days inf: a number of days"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--step", "0"], ["--step '0'", "positive duration"]),
    (["reconcilers", "plan", "--prometheus", "http://127.0.0.1:9", "--step", "5 minutes"], ["--step '5 minutes'"]),
])
def test_bad_arguments_are_named(command, names):
    result = run(command)
    assert_one_clean_line(result, *names)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # no usage block before it


def test_certs_generate_keeps_an_existing_ca_certificate_or_key_unless_forced(tmp_path):
    first = run(["certs", "generate", "--dir", str(tmp_path), "--host", "localhost"])
    assert first.returncode == 0, first.stderr
    ca = (tmp_path / "ca.crt").read_bytes()
    again = run(["certs", "generate", "--dir", str(tmp_path), "--host", "localhost"])
    assert_one_clean_line(again, "ca.crt exists", "--force")
    assert (tmp_path / "ca.crt").read_bytes() == ca
    forced = run(["certs", "generate", "--dir", str(tmp_path), "--host", "localhost", "--force"])
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "ca.crt").read_bytes() != ca
    # A certificate or key alone (its CA kept elsewhere) is kept too.
    for name in ("tls.crt", "tls.key"):
        alone = tmp_path / name.replace(".", "-")
        alone.mkdir()
        (alone / name).write_bytes((tmp_path / name).read_bytes())
        refused = run(["certs", "generate", "--dir", str(alone), "--host", "localhost"])
        assert_one_clean_line(refused, f"{alone / name} exists: a certificate or key put there would be replaced",
                              "--force")
        assert [path.name for path in alone.iterdir()] == [name]
        assert (alone / name).read_bytes() == (tmp_path / name).read_bytes()


@pytest.mark.parametrize("module", ["webhook", "scheduler", "reconcilers", "certs"])
def test_help_lists_debug_and_defaults(module):
    result = run([module, "--help"])
    assert result.returncode == 0 and "--debug" in result.stdout


@pytest.mark.parametrize("command", [
    ["reconcilers", sub] for sub in ("run", "once", "remediate", "backtest", "plan")] + [
    ["certs", sub] for sub in ("generate", "ensure", "inject")] + [
    ["simulator.tune"], ["simulator.budget_check"]] + [
    [f"bench.{name}"] for name in ("extender_failover", "extender_memory", "extender_speed", "plan_example",
                                   "reconcile_scale", "reconciler_memory", "soak", "sqlite_history", "webhook_load",
                                   "workload_history")])
def test_every_commands_help_prints(command):
    # argparse formats help text with %: a bare percent sign in one option's help broke --help.
    result = run([*command, "--help"])
    assert result.returncode == 0 and result.stdout.startswith("usage: "), result.stderr
    assert "Traceback" not in result.stderr


def test_the_benchs_cpu_figure_is_the_cpu_time_linux_gives_the_process():
    from bench.proc import cpu_seconds
    # It spins by os.times(), the figure it reports: process_time() is finer than os.times()'s
    # clock ticks, and half a second of it read 0.49 s there once.
    child = subprocess.Popen([sys.executable, "-c", "import os, sys\n"
                              "while sum(os.times()[:2]) < 0.5: pass\n"
                              "t = os.times(); print(t.user + t.system, flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        own = float(child.stdout.readline())
        assert own >= 0.5 and abs(cpu_seconds(child.pid) - own) < 0.05
    finally:
        child.communicate("", timeout=30)
    with pytest.raises(OSError):
        cpu_seconds(child.pid)  # reaped: its /proc entry is gone


def test_backtest_help_shows_every_default():
    text = run(["reconcilers", "backtest", "--help"]).stdout
    for default in ("backtest-report", "(default: 32", "256Gi", "(default: 7)", "(default: 14)"):
        assert default in " ".join(text.split()), default


def test_format_choices_are_the_readers_formats_and_parsing_them_loads_no_numpy():
    # The reconcilers' parser is built on every `python -m reconcilers run`; the replay's numpy
    # is only for backtest and plan, so the format names come from a module without it.
    code = ("import sys; from reconcilers.__main__ import main\n"
            "try:\n    main(['backtest', '--trace', 'x.csv', '--format', 'nope'])\n"
            "except SystemExit as exit:\n    print(exit.code, 'numpy' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["2", "False"], result.stdout + result.stderr
    from simulator.trace import FORMATS, WIDE_FORMATS
    for name in (*FORMATS, *WIDE_FORMATS):
        assert f"'{name}'" in result.stderr, result.stderr


def _pytest(env: dict[str, str], workers: tuple[str, ...] = (),
            tests: tuple[str, ...] = ("tests/test_quantity.py",)) -> subprocess.CompletedProcess[str]:
    # Neither the suite's switches nor the copies conftest keeps of them for its workers.
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSALE_", "PYTEST_OVERSALE_"))} | env
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, *tests],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)


def one_pod_corpus(tmp_path: Path) -> Path:
    """A corpus of one Pod, standing for the real one so that a test holds wherever the suite runs."""
    corpus = tmp_path / "shared"
    (corpus / "fixtures" / "pods").mkdir(parents=True)
    (corpus / "fixtures" / "pods" / "pod.json").write_text("{}")
    return corpus


# In this process, and as `make test` runs the suite: a test file to each of two pytest-xdist workers.
AS_RUN = pytest.mark.parametrize("workers", [(), ("--numprocesses=2", "--dist=loadfile")], ids=["alone", "workers"])


@AS_RUN
def test_without_the_shared_corpus_its_tests_are_left_out_with_one_line_and_the_rest_passes(workers):
    result = _pytest({"OVERSALE_SHARED_DIR": "/nonexistent/shared"}, workers)
    assert result.returncode == 0, result.stdout
    skipped = [line for line in result.stdout.splitlines() if "marked 'shared'" in line]
    assert len(skipped) == 1 and "/nonexistent/shared" in skipped[0] and "../shared/" in skipped[0], result.stdout
    assert skipped[0].startswith("SKIPPED 1 tests") and " passed" in result.stdout, result.stdout


@AS_RUN
def test_ci_refuses_to_run_without_the_shared_corpus(workers):
    result = _pytest({"OVERSALE_SHARED_DIR": "/nonexistent/shared", "OVERSALE_REQUIRE_SHARED": "1"}, workers)
    assert result.returncode != 0 and "OVERSALE_REQUIRE_SHARED=1" in result.stdout + result.stderr


@AS_RUN
def test_ci_fails_a_test_of_the_corpus_that_skips_itself(tmp_path, workers):
    # A file missing from the corpus (not the whole corpus): the test skips itself, and CI counts it failed.
    (tmp_path / "test_corpus_file.py").write_text(
        "import pytest\n\n\n@pytest.mark.shared\ndef test_reads_a_file():\n    pytest.skip('no such trace')\n")
    tests = ("-p", "tests.conftest", str(tmp_path / "test_corpus_file.py"))
    corpus = one_pod_corpus(tmp_path)
    required = _pytest({"OVERSALE_SHARED_DIR": str(corpus), "OVERSALE_REQUIRE_SHARED": "1"}, workers, tests)
    assert required.returncode == 1 and "1 failed" in required.stdout, required.stdout
    assert "OVERSALE_REQUIRE_SHARED=1 and a test that reads ../shared/ was skipped" in required.stdout
    assert "1 skipped" in _pytest({"OVERSALE_SHARED_DIR": str(corpus)}, workers, tests).stdout


@AS_RUN
def test_a_test_that_reads_the_corpus_unmarked_fails_where_the_corpus_is(tmp_path, workers):
    # Without the mark it would fail where the corpus is absent, instead of being left out.
    corpus = one_pod_corpus(tmp_path)
    (tmp_path / "test_corpus_read.py").write_text(textwrap.dedent("""\
        import pytest
        from tests.conftest import SHARED


        def test_unmarked():
            assert (SHARED / "fixtures" / "pods" / "pod.json").read_text() == "{}"


        @pytest.mark.shared
        def test_marked():
            assert (SHARED / "fixtures" / "pods" / "pod.json").read_text() == "{}"


        def test_elsewhere(tmp_path):
            (tmp_path / "x").write_text("y")
            assert (tmp_path / "x").read_text() == "y"
        """))
    result = _pytest({"OVERSALE_SHARED_DIR": str(corpus)}, workers,
                     ("-p", "tests.conftest", str(tmp_path / "test_corpus_read.py")))
    assert result.returncode == 1 and "1 failed, 2 passed" in result.stdout, result.stdout
    assert f"this test read {corpus / 'fixtures' / 'pods' / 'pod.json'} (and 0 more) but is not marked 'shared'" \
        in result.stdout


def test_a_history_file_that_is_not_sqlite_is_named_and_left_alone(tmp_path):
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        other = tmp_path / "notes.txt"
        other.write_text("someone else's file, named by the setting by mistake\n" * 10)
        result = run(["reconcilers", "once", "--dry-run"], kubeconfig, OVERSALE_SQLITE_PATH=str(other))
        line = assert_one_clean_line(result, f"OVERSALE_SQLITE_PATH='{other}'", "file is not a database",
                                     "move it away")
        assert "DatabaseError" not in line
        assert other.read_text().startswith("someone else's file"), "never overwritten"
        folder = run(["reconcilers", "once", "--dry-run"], kubeconfig, OVERSALE_SQLITE_PATH=str(tmp_path))
        assert_one_clean_line(folder, f"OVERSALE_SQLITE_PATH='{tmp_path}'", "unable to open database file")
    finally:
        api.stop()


@pytest.mark.parametrize("module", ["webhook", "scheduler"])
def test_a_certificate_pair_that_cannot_serve_tls_is_refused_before_serving(module, tmp_path):
    # gunicorn would load the pair on each connection and fail every handshake with a log line.
    for name in ("one", "two"):
        made = run(["certs", "generate", "--dir", str(tmp_path / name), "--host", "localhost"])
        assert made.returncode == 0, made.stderr
    certs = tmp_path / "one"
    (certs / "tls.key").write_bytes((tmp_path / "two" / "tls.key").read_bytes())
    args = [module, "--bind", f"127.0.0.1:{free_port()}", "--certs-dir", str(certs)]
    assert_one_clean_line(run(args, OVERSALE_KUBERNETES="off"), f"--certs-dir {certs}",
                          "tls.key does not match tls.crt")
    (certs / "tls.key").write_text("not a key\n")
    assert_one_clean_line(run(args, OVERSALE_KUBERNETES="off"), "tls.key is not a PEM private key")
    (certs / "tls.crt").write_text("not a certificate\n")
    assert_one_clean_line(run(args, OVERSALE_KUBERNETES="off"), "tls.crt is not a PEM certificate")


def test_the_webhook_makes_certificates_only_in_a_directory_without_any_and_writes_over_none(tmp_path):
    """A --certs-dir holding part of a set (a certificate whose key was not copied, a CA alone)
    is refused in one line, and its files stay as they were; a set is made only where none is."""
    made = run(["certs", "generate", "--dir", str(tmp_path / "own"), "--host", "localhost"])
    assert made.returncode == 0, made.stderr
    for keep in (["tls.crt"], ["ca.crt"], ["ca.crt", "tls.key"]):
        certs = tmp_path / "-".join(keep)
        certs.mkdir()
        for name in keep:
            (certs / name).write_bytes((tmp_path / "own" / name).read_bytes())
        refused = run(["webhook", "--bind", f"127.0.0.1:{free_port()}", "--certs-dir", str(certs)],
                      OVERSALE_KUBERNETES="off")
        missing = [name for name in ("ca.crt", "tls.crt", "tls.key") if name not in keep]
        assert_one_clean_line(refused, f"--certs-dir {certs}: holds {' and '.join(keep)} but no {' or '.join(missing)}")
        assert sorted(path.name for path in certs.iterdir()) == sorted(keep)
        assert all((certs / name).read_bytes() == (tmp_path / "own" / name).read_bytes() for name in keep)


def test_a_client_ca_that_cannot_be_used_is_refused_before_serving(tmp_path):
    """The extender's --client-ca is checked at start: it needs TLS (--certs-dir), a file, and a
    CA certificate in it; else one line says which, instead of handshakes that fail later."""
    made = run(["certs", "generate", "--dir", str(tmp_path), "--host", "localhost"])
    assert made.returncode == 0, made.stderr
    junk = tmp_path / "client-ca.crt"
    junk.write_text("not a certificate\n")

    def extender(*args: str) -> subprocess.CompletedProcess[str]:
        return run(["scheduler", "--bind", f"127.0.0.1:{free_port()}", *args], OVERSALE_KUBERNETES="off")

    assert_one_clean_line(extender("--certs-dir", str(tmp_path), "--client-ca", str(junk)), f"--client-ca {junk}",
                          "holds no PEM CA certificate")
    assert_one_clean_line(extender("--client-ca", str(tmp_path / "ca.crt")), "--client-ca needs --certs-dir")
    missing = tmp_path / "missing.crt"
    assert_one_clean_line(extender("--certs-dir", str(tmp_path), "--client-ca", str(missing)),
                          f"--client-ca {missing}: no such file")


def opted_in(api: FakeKubeAPI) -> None:
    """A workload and a node that ask the reconcilers for their ratios."""
    api.put("deployments", {
        "metadata": {"name": "web", "namespace": "shop",
                     "annotations": {"stke.platform/enable-resource-compress": "y"}},
        "spec": {"template": {"metadata": {}, "spec": {"containers": [
            {"name": "app", "image": "nginx", "resources": {"requests": {"cpu": "1"}}}]}}}})
    api.put("nodes", {"metadata": {"name": "node-1", "labels": {"stke.platform/oversale": "enabled"}},
                      "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                                 "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"}}})


def test_once_exits_1_saying_why_when_the_pass_could_not_decide_everything(tmp_path):
    """A script or CronJob running one pass: 0 when the pass decided everything it could (young
    history holds ratios, that is a decision), 1 with one line naming what stopped it otherwise;
    the table is printed either way."""
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        opted_in(api)
        young = run(["reconcilers", "once", "--dry-run"], kubeconfig, OVERSALE_SQLITE_PATH=str(tmp_path / "h.db"))
        assert young.returncode == 0, young.stderr
        assert "Node/node-1" in young.stdout and "pass incomplete" not in young.stderr
        port = free_port()
        dead = run(["reconcilers", "once", "--dry-run"], kubeconfig, OVERSALE_PROMETHEUS_URL=f"http://127.0.0.1:{port}")
        assert dead.returncode == 1, dead.stderr
        assert "Deployment/shop/web" in dead.stdout and "history unavailable, holding" in dead.stdout
        (line,) = [line for line in dead.stderr.splitlines() if line.startswith("pass incomplete: ")]
        assert f"container history unavailable (prometheus at http://127.0.0.1:{port} unreachable" in line
        assert "; node history unavailable (" in line
        assert "Traceback" not in dead.stderr
    finally:
        api.stop()


def test_once_on_a_damaged_history_file_names_it_and_exits_1(tmp_path):
    """The file opens (its first page is whole) but no table reads: the sample is not written, the
    pass holds every ratio, and both are said in one line naming the file and what to do."""
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        opted_in(api)
        path = tmp_path / "h.db"
        assert run(["reconcilers", "once", "--dry-run"], kubeconfig, OVERSALE_SQLITE_PATH=str(path)).returncode == 0
        damage_sqlite(path)
        damaged = run(["reconcilers", "once", "--dry-run"], kubeconfig, OVERSALE_SQLITE_PATH=str(path))
        assert damaged.returncode == 1, damaged.stderr
        assert "Traceback" not in damaged.stderr and "DatabaseError" not in damaged.stderr, damaged.stderr
        assert "Deployment/shop/web" in damaged.stdout and "history unavailable, holding" in damaged.stdout
        (line,) = [line for line in damaged.stderr.splitlines() if line.startswith("pass incomplete: ")]
        malformed = ("database disk image is malformed; move it away and restart the reconcilers to start the "
                     "history afresh")
        assert line == (f"pass incomplete: usage history {path} not written, this sample is lost: {malformed}; "
                        f"container history unavailable (usage history {path} unreadable: {malformed}); node "
                        f"history unavailable (usage history {path} unreadable: {malformed})")
    finally:
        api.stop()


SKIPPED = "metrics API (metrics.k8s.io) not readable, this reading is skipped: "


@pytest.mark.parametrize(("broken", "plurals", "said"), [
    # metrics-server down: the aggregator's 503
    ("unavailable", ("podmetrics", "nodemetrics"), SKIPPED + "HTTP 503 Service Unavailable"),
    ("absent", ("podmetrics", "nodemetrics"),
     SKIPPED + "HTTP 404 Not Found: the server could not find the requested resource (is metrics-server installed? "
               "Or set OVERSALE_PROMETHEUS_URL)"),
    # A proxy in front of the API server answering its login page.
    ("garbled", ("podmetrics", "nodemetrics"),
     SKIPPED + "the answer to /apis/metrics.k8s.io/v1beta1/pods is no Kubernetes object (text/html, 45 bytes)"),
    # The Pods' list alone fails (on a large cluster it can time out): the nodes' half is kept.
    ("unavailable", ("podmetrics",), "metrics API (metrics.k8s.io) PodMetrics not readable, this reading holds the "
                                     "nodes alone: HTTP 503 Service Unavailable"),
])
def test_once_without_metrics_server_passes_on_the_history_held_and_exits_1(tmp_path, broken, plurals, said):
    """`once` with the SQLite history takes one reading first; when the metrics API fails, the
    pass still decides on the history already held (the ratios it wrote stand) and says what was
    missed, rather than stopping with the API server's bare 503 before any pass."""
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        opted_in(api)
        getattr(api, broken).update(plurals)
        result = run(["reconcilers", "once", "--dry-run"], kubeconfig, OVERSALE_SQLITE_PATH=str(tmp_path / "h.db"))
        assert result.returncode == 1, result.stderr
        assert "Deployment/shop/web" in result.stdout and "Node/node-1" in result.stdout, "the pass ran"
        assert "Traceback" not in result.stderr and "error:" not in result.stderr, result.stderr
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("pass incomplete: ")]
        assert line == f"pass incomplete: {said}"
    finally:
        api.stop()


@pytest.mark.parametrize(("garbled", "decided", "said"), [
    ("deployments", "Node/node-1", "compression: the API server failed (the answer to /apis/apps/v1/deployments is "
                                   "no Kubernetes object (text/html, 45 bytes))"),
    ("nodes", "Deployment/shop/web", "oversale: the API server failed (the answer to /api/v1/nodes is no Kubernetes "
                                     "object (text/html, 45 bytes))"),
])
def test_once_names_an_answer_that_is_no_kubernetes_object_and_decides_the_rest(tmp_path, garbled, decided, said):
    """A proxy in front of the API server answering its sign-in page on some paths: the pass that
    reads there stops, saying which path answered what, and the other still decides. It was
    ``error: JSONDecodeError: Expecting value: line 1 column 1 (char 0)`` and no pass at all."""
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        opted_in(api)
        api.garbled.add(garbled)
        result = run(["reconcilers", "once", "--dry-run"], kubeconfig, OVERSALE_SQLITE_PATH=str(tmp_path / "h.db"))
        assert result.returncode == 1, result.stderr
        assert decided in result.stdout, result.stdout
        assert "Traceback" not in result.stderr and "error:" not in result.stderr, result.stderr
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("pass incomplete: ")]
        assert line == f"pass incomplete: {said}"
    finally:
        api.stop()


def test_certs_inject_says_in_one_line_what_it_could_not_read_and_writes_nothing(tmp_path):
    """A CA file that is missing or is a folder, RBAC refusing to let it read the webhook
    configuration, and a proxy answering its sign-in page instead: each is one line naming the
    file, or what the API server said, exit code 2, and nothing is written."""
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        made = run(["certs", "generate", "--dir", str(tmp_path), "--host", "localhost"])
        assert made.returncode == 0, made.stderr
        api.put("mutatingwebhookconfigurations", {"metadata": {"name": "oversale"}, "webhooks": [
            {"name": "pods.oversale.io", "clientConfig": {"service": {"namespace": "oversale", "name": "w"}}}]})

        def inject(ca_file: Path) -> str:
            return assert_one_clean_line(run(["certs", "inject", "--webhook", "oversale", "--ca-file", str(ca_file)],
                                             kubeconfig))

        hint = " (--debug shows the traceback)"
        assert inject(tmp_path / "missing.crt") == f"error: {tmp_path / 'missing.crt'}: no such file or directory{hint}"
        assert inject(tmp_path) == f"error: {tmp_path}: Is a directory{hint}"
        api.storms["mutatingwebhookconfigurations"] = [403, 1]
        assert inject(tmp_path / "ca.crt") == (
            'error: the API server refused the request: HTTP 403 Forbidden: mutatingwebhookconfigurations "oversale" '
            'is forbidden: User "system:serviceaccount:oversale:oversale" cannot get resource '
            f'"mutatingwebhookconfigurations"{hint}')
        api.garbled.add("mutatingwebhookconfigurations")
        assert inject(tmp_path / "ca.crt") == (
            "error: the answer to /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/oversale is no "
            "Kubernetes object (text/html, 45 bytes): is the server in KUBECONFIG a Kubernetes API server? (kubectl "
            f"cluster-info){hint}")
        assert not [r for r in api.requests if r.method == "PATCH"], "nothing written"
        configuration = api.get("mutatingwebhookconfigurations", "", "oversale")
        assert configuration is not None and "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    finally:
        api.stop()


def test_remediate_tells_an_unreadable_usage_from_no_hot_node(tmp_path):
    """`remediate` said "no node above its runtime watermark" when metrics-server was down: it had
    judged no node at all. Now that is one line saying why, and exit 1."""
    api = FakeKubeAPI().start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        api.put("nodes", {"metadata": {"name": "node-1", "labels": {"stke.platform/oversale": "enabled"}},
                          "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}})
        cool = run(["reconcilers", "remediate", "--dry-run"], kubeconfig)
        assert cool.returncode == 0, cool.stderr
        assert cool.stdout.strip() == "no node above its runtime watermark"
        api.unavailable.add("nodemetrics")  # the aggregator's 503 while metrics-server is down
        down = run(["reconcilers", "remediate", "--dry-run"], kubeconfig)
        assert down.returncode == 1, down.stderr
        assert down.stdout == "", "no empty table, and not \"no node above its runtime watermark\""
        (line,) = [line for line in down.stderr.splitlines() if line.startswith("pass incomplete: ")]
        assert line == "pass incomplete: cannot read usage or the cluster (HTTP 503 Service Unavailable)"
        api.unavailable.clear()
        api.garbled.add("nodemetrics")  # a proxy in front of the API server answering its login page
        garbled = run(["reconcilers", "remediate", "--dry-run"], kubeconfig)
        assert garbled.returncode == 1, garbled.stderr
        (line,) = [line for line in garbled.stderr.splitlines() if line.startswith("pass incomplete: ")]
        assert line == ("pass incomplete: cannot read usage or the cluster (the answer to "
                        "/apis/metrics.k8s.io/v1beta1/nodes is no Kubernetes object (text/html, 45 bytes))")
    finally:
        api.stop()
