"""Scale-out behaviour of real replicas behind the client's load balancing.

Three temb-server processes on 127.0.0.1 stand in for three pods behind a
headless Service; `temb bench` gets all three addresses in one target
(ipv4:A,B,C), as a client would from the Service's DNS.  The client's
service config asks for round_robin and retries UNAVAILABLE, so:
  - every replica serves a real share of the calls;
  - a replica killed outright (SIGKILL: a crashed pod) costs no call;
  - a replica told to stop (SIGTERM: a pod being deleted) drains, costs no
    call and exits 0;
  - a replica restarted on the same address rejoins and serves again.
Replica shares are read from each server's own temb_requests_total, so they
count what the servers answered, not what the client believes it sent.
"""

import signal
import time

import pytest

import tembproc

REPLICAS = 3
DRAIN_GRACE = "3s"
BENCH_TIMEOUT_S = 60


class Cluster:
    def __init__(self, workdir):
        self.servers = [tembproc.Server(workdir, f"replica{i}", drain_grace=DRAIN_GRACE)
                        for i in range(REPLICAS)]

    def ensure_all_up(self):
        for server in self.servers:
            if not server.alive():
                server.start()

    @property
    def target(self):
        return "ipv4:" + ",".join(s.address for s in self.servers)

    def counts(self):
        return [s.requests_ok() for s in self.servers]

    def stop(self):
        for server in self.servers:
            server.stop()

    def logs(self):
        return "\n".join(f"--- {s.name} (start {s.starts})\n{s.log()}"
                         for s in self.servers if s.starts)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("replicas"))
    try:
        cluster.ensure_all_up()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def replicas(cluster):
    cluster.ensure_all_up()
    yield cluster
    # pytest shows captured output only for failed tests: the server logs.
    print(cluster.logs())


def assert_no_errors(report):
    assert report["requests"] > 0, report
    failed = {code: n for code, n in report.get("errors", {}).items() if n}
    assert not failed, f"failed calls by status code: {failed} (report: {report})"


def test_round_robin_spreads_calls_over_every_replica(replicas):
    before = replicas.counts()
    report = tembproc.bench_result(tembproc.start_bench(replicas.target, "3s"),
                                   BENCH_TIMEOUT_S)
    served = [after - b for after, b in zip(replicas.counts(), before)]
    assert_no_errors(report)
    assert sum(served) >= report["requests"], (served, report)
    for server, n in zip(replicas.servers, served):
        # round_robin gives each a third; a pinned connection gives one all.
        assert n >= 0.2 * sum(served), f"{server.name} served {n} of {served}"


def test_killed_replica_costs_no_call_and_its_restart_rejoins(replicas):
    victim = replicas.servers[0]
    bench = tembproc.start_bench(replicas.target, "10s")
    time.sleep(2)
    assert bench.poll() is None, "the bench ended before the kill"
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    time.sleep(0.5)
    victim.start()  # same port: the client's address list still names it
    # The others' calls from now on, against the restarted one's (which
    # counts from zero): the same window, whatever earlier tests sent.
    others_before = sum(s.requests_ok() for s in replicas.servers[1:])
    report = tembproc.bench_result(bench, BENCH_TIMEOUT_S)
    assert_no_errors(report)
    rejoined = victim.requests_ok()
    others = sum(s.requests_ok() for s in replicas.servers[1:]) - others_before
    assert rejoined >= 0.05 * (rejoined + others), \
        f"restarted replica served {rejoined} calls, the others {others}"


def test_terminated_replica_drains_without_failed_calls(replicas):
    victim = replicas.servers[1]
    bench = tembproc.start_bench(replicas.target, "6s")
    time.sleep(2)
    assert bench.poll() is None, "the bench ended before SIGTERM"
    assert victim.requests_ok() > 0, "the replica had no traffic to drain"
    victim.signal(signal.SIGTERM)
    exit_code = victim.wait(timeout=tembproc.STARTUP_TIMEOUT_S)
    report = tembproc.bench_result(bench, BENCH_TIMEOUT_S)
    assert exit_code == 0, f"drained replica exited {exit_code}:\n{victim.log()}"
    assert_no_errors(report)
