"""Fleet scale on Kubernetes: 1,000 concurrent waits in one process, shared informer vs one watch per wait.

The Kubernetes test server (this process) holds ``clusters`` Ray clusters of
one worker; a child process scales them all at once with ``wait=True``
(:mod:`benchmarks.k8s_scale_client`), once with this tree (one shared pod
list+watch per namespace) and once with the previous design, the plugin at
commit :data:`benchmarks.previous_design.PREVIOUS` exported from git (one
list+watch per wait). A third and fourth run do the same waits through the
Flyte connector (:mod:`benchmarks.fleet_connector_client`): one
``ddlscale_wait`` execution per cluster, each polled with ``get`` every
``poll`` seconds, current tree vs previous design.

Lag (backend): the child's return minus the moment the server stored that
cluster's last new worker Ready (same clock). Lag (connector): the first
``get`` that answered SUCCEEDED returned this long after the later of the
Ready moment and the start of that poll, i.e. the lag of the answer itself,
not the wait for Flyte's next poll (a ``get`` that started after the Ready
moment but still answered RUNNING counts from the Ready moment). Peak RSS is
the child's alone; open watches and requests are counted by the server. The
shared connector lane also writes every execution's polls and its cluster's
moments to ``<name>_polls.json.gz`` beside the result, to re-read a figure.

``server="envtest"`` (benchmark ``fleet_k8s_envtest``) runs the shared-design
lanes (backend and connector) against a real kube-apiserver with etcd
(:mod:`benchmarks.real_k8s`): the client is the non-admin user bound to the
shipped Role, Ready moments are the fake kubelet's status writes, and
requests and open watches come from the API server's audit log. The previous
design is compared on the test server only.
"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from benchmarks.k8s_scale_client import NAMESPACE, OWNER, cluster_name
from benchmarks.previous_design import PREVIOUS, command, export
from benchmarks.report import BenchResult, Target
from benchmarks.stats import summarize

NAME = "fleet_k8s"
TITLE = "1,000 concurrent waits on 1,000 clusters (Kubernetes backend and connector): shared informer vs one watch per wait"
SERVERS = {"test-server": NAME, "envtest": f"{NAME}_envtest"}
"""The servers to measure on, and the result name of each."""
TITLES = {"test-server": TITLE,
          "envtest": "1,000 concurrent waits on 1,000 clusters on a real kube-apiserver and etcd (backend and connector)"}
LAG_LIMIT_MS = 100.0
RSS_LIMIT_MB = 300.0
NAMESPACES = 1
RESOURCES = 2
"""The resources waits and polls watch: pods, and the cluster objects of the kind (RayClusters here)."""
CLIENT_LAG_LIMIT_MS = 20.0
"""On the real server: a wait's return after the API server accepted the last Ready write (what the client adds)."""
ANSWER_LAG_LIMIT_MS = 50.0
"""On the real server: a connector answer's lag counted from the API server's acceptance of the Ready write."""
REQUESTS_PER_POLL_LIMIT = 0.01
"""API requests per connector poll after every execution's first (the polls are answered from the caches)."""
REPO_ROOT = Path(__file__).resolve().parents[1]
PATHS = ("backend", "connector")
"""The two paths measured: waits through the backend, polls through the connector."""


@dataclass(frozen=True)
class Plan:
    """How much to measure."""

    clusters: int
    ready_delay: float
    """Seconds each new worker pod takes to become Ready."""
    poll: float
    """Seconds between one execution's connector polls."""
    senders: int = 16
    """Scale requests in flight at once (the API server's write path is not what is measured)."""
    replicas: int = 2
    child_timeout: float = 900.0


QUICK = Plan(clusters=12, ready_delay=2.0, poll=0.5, child_timeout=300.0)
FULL = Plan(clusters=1000, ready_delay=40.0, poll=5.0)


@contextlib.contextmanager
def _server(plan: Plan, envtest: Any) -> Iterator[Any]:
    """A server with ``plan.clusters`` Ray clusters of one Ready worker, new pods then Ready after
    ``plan.ready_delay``: a fresh test server, or (``envtest``: a running control plane) its namespace
    :data:`NAMESPACE`, deleted afterwards."""
    if envtest is None:
        from benchmarks.servers import timed_k8s_server

        server = timed_k8s_server(ready_delay=0.0).start()
    else:
        from benchmarks.real_k8s import RealK8sServer

        server = RealK8sServer(envtest, NAMESPACE)
    try:
        for i in range(plan.clusters):
            server.add_cluster(
                "ray", cluster_name(i), NAMESPACE, replicas=1,
                autoscaling={"minReplicas": 1, "maxReplicas": 8}, owner=OWNER, wait_ready=False,
            )
        deadline = time.monotonic() + 600
        while len(server.ready_moments_all("worker")) < plan.clusters:
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after 600 s waiting for {plan.clusters} clusters to come up")
            time.sleep(0.1)
        server.set_ready_delay(plan.ready_delay)
        server.clear_log()
        yield server
    finally:
        server.close()


def _requests(server: Any, skip: int = 0) -> Dict[str, int]:
    """The client's requests by kind (after the first ``skip``): a GET of one cluster object is a read
    the caches could not answer; lists and watches of the cluster objects are their informer's; a PATCH
    answered 409 (another writer, such as the operator's status update, came between the read and the
    write: read again and sent again) is a conflict, not a patch."""
    counts = {"total": 0, "pod_lists": 0, "pod_watches": 0, "cluster_gets": 0, "cluster_lists": 0,
              "cluster_watches": 0, "patches": 0, "conflicts": 0}
    for r in list(server.requests)[skip:]:
        counts["total"] += 1
        if r.path.endswith("/pods"):
            counts["pod_watches" if r.query.get("watch") == "true" else "pod_lists"] += 1
        elif r.method == "GET" and r.path.rstrip("/").endswith("/rayclusters"):
            counts["cluster_watches" if r.query.get("watch") == "true" else "cluster_lists"] += 1
        elif r.method == "GET":
            counts["cluster_gets"] += 1
        elif r.method == "PATCH":
            counts["conflicts" if r.status == 409 else "patches"] += 1
    return counts


def _run_child(cmd: List[str], timeout: float) -> Tuple[Optional[Dict[str, Any]], str]:
    try:
        child = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO_ROOT), check=False)
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {timeout:.0f} s"
    if child.returncode != 0:
        return None, f"child failed ({child.returncode}): {child.stderr[-1500:]}"
    return json.loads(child.stdout.strip().splitlines()[-1]), ""


def _client_target(server: Any) -> str:
    """How a child process reaches ``server``: its kubeconfig (the real API server's user), else its URL."""
    kubeconfig = getattr(server, "kubeconfig", None)
    return str(kubeconfig) if kubeconfig else server.url


def _backend_lane(plan: Plan, tree: Optional[Path], envtest: Any = None) -> Dict[str, Any]:
    with _server(plan, envtest) as server:
        launched = time.time()
        load_start = os.getloadavg()[0]
        args = (_client_target(server), str(plan.clusters), str(plan.replicas), str(plan.senders))
        cmd = command(tree, "benchmarks.fleet_wait_client", *args) if tree else [
            sys.executable, "-m", "benchmarks.fleet_wait_client", *args]
        report, failure = _run_child(cmd, plan.child_timeout)
        lags, errors, client_lags = [], [], []
        for call in (report or {}).get("calls", []):
            moments = server.ready_moments(call["cluster"], "worker", since=launched)
            if call["error"]:
                errors.append(f"{call['cluster']}: {call['error'][:200]}")
            elif len(moments) < plan.replicas - 1:
                errors.append(f"{call['cluster']}: returned with {len(moments)} new Ready workers")
            else:
                lags.append((call["returned"] - max(moments)) * 1000.0)
                if hasattr(server, "accepted_moments"):
                    accepted = server.accepted_moments(call["cluster"], "worker", since=launched)
                    client_lags.append((call["returned"] - max(accepted)) * 1000.0)
        summary = _lane_summary(server, report, failure, lags, errors, time.time() - launched, launched)
        if client_lags:
            # What the client adds: its return after the API server accepted the last Ready write.
            summary["client_lag_ms"] = summarize(client_lags, 1)
        summary["load_average_1m_start_end"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
        summary["peak_concurrent_waits"] = (report or {}).get("peak_waits")
        return summary


def _send_scales(server: Any, plan: Plan) -> List[str]:
    """Send every cluster's scale request (no wait), ``plan.senders`` at a time; the errors."""
    from concurrent.futures import ThreadPoolExecutor

    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend

    api = server.api_client(plan.senders + 4)
    with KubernetesBackend(NAMESPACE, api_client=api, owner=OWNER, request_timeout=120) as backend:

        def one(index: int) -> str:
            try:
                backend.scale(ClusterRef("ray", cluster_name(index), NAMESPACE), plan.replicas, wait=False, timeout=300)
                return ""
            except Exception as exc:  # counted by the caller
                return f"{cluster_name(index)}: scale: {exc!r}"[:200]

        with ThreadPoolExecutor(plan.senders) as pool:
            return [e for e in pool.map(one, range(plan.clusters)) if e]


def _connector_lane(plan: Plan, tree: Optional[Path], workdir: Path, envtest: Any = None,
                    raw: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """One connector child answering every execution's polls; the lane's summary. Into ``raw``, when
    given, one row per execution: its cluster's moments (workers Ready, write accepted, cache held them
    Ready; time.time()) and every poll (began, returned, done, loop CPU ms, process CPU ms, waited)."""
    with _server(plan, envtest) as server:
        kubeconfig = getattr(server, "kubeconfig", None) or workdir / "kubeconfig"
        if envtest is None:
            kubeconfig.write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "bench",
                "clusters": [{"name": "k", "cluster": {"server": server.url}}],
                "users": [{"name": "u", "user": {"token": "bench-token"}}],
                "contexts": [{"name": "bench", "context": {"cluster": "k", "user": "u", "namespace": NAMESPACE}}],
            }))
        args = (str(kubeconfig), str(plan.clusters), str(plan.replicas), str(plan.poll))
        cmd = command(tree, "benchmarks.fleet_connector_client", *args) if tree else [
            sys.executable, "-m", "benchmarks.fleet_connector_client", *args]
        child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=str(REPO_ROOT))
        errors_out: List[str] = []
        drain = threading.Thread(target=lambda: errors_out.append(child.stderr.read() if child.stderr else ""),
                                 daemon=True)
        drain.start()
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            child.kill()

        killer = threading.Timer(plan.child_timeout, kill)
        killer.daemon = True
        killer.start()
        first: Optional[Tuple[float, int]] = None
        """When every execution had made its first poll, and how many requests the server had by then."""
        out = quiet = ""
        try:
            warm = child.stdout.readline() if child.stdout else ""
            launched = time.time()
            load_start = os.getloadavg()[0]
            # The scale requests (no wait) are sent here while the connector process keeps its caches
            # warm with one execution's polls; then it stops that and answers only the measured polls,
            # and only their requests are counted.
            send_errors = _send_scales(server, plan)
            _say(child, "sent")
            quiet = child.stdout.readline() if child.stdout else ""
            server.clear_log()
            _say(child, "go")
            for line in child.stdout if child.stdout else []:
                if line.startswith("first "):
                    first = (float(line.split()[1]), len(server.requests))
                elif line.strip():
                    out = line
            child.wait()
        finally:
            killer.cancel()
            drain.join()
        err = f"did not finish within {plan.child_timeout:.0f} s" if timed_out.is_set() else "".join(errors_out)
        report: Optional[Dict[str, Any]] = None
        failure = ""
        if warm.strip() != "warm" or quiet.strip() != "quiet" or child.returncode != 0 or not out.strip():
            failure = f"connector child failed ({child.returncode}): {err[-1500:]}"
        else:
            report = json.loads(out.strip().splitlines()[-1])
        lags, errors, client_lags, to_cache, after_cache = [], list(send_errors), [], [], []
        after_cache_cpu: Dict[str, List[float]] = {"loop": [], "process": []}
        polled_before: List[float] = []
        """The client's part for executions that had polled before their cache held the workers Ready (the
        others' first poll found them Ready: a first poll, which may read the server)."""
        waited: Dict[bool, List[float]] = {True: [], False: []}
        """The client's part of the lag, by whether the answering poll waited (a reader thread) or not."""
        for execution in (report or {}).get("executions", []):
            moments = server.ready_moments(execution["cluster"], "worker", since=launched)
            if execution["error"] or not moments:
                errors.append(f"{execution['cluster']}: {execution['error'] or 'no Ready moment'}"[:200])
                continue
            lags.append(_answer_lag(execution["polls"], max(moments)))
            accepted = (server.accepted_moments(execution["cluster"], "worker", since=launched)
                        if hasattr(server, "accepted_moments") else [])
            if raw is not None:
                raw.append({"cluster": execution["cluster"], "ready": max(moments),
                            "accepted": max(accepted) if accepted else None, "cached": execution.get("cached"),
                            "polls": [[round(value, 4) for value in poll] for poll in execution["polls"]]})
            if accepted:
                client_lags.append(_answer_lag(execution["polls"], max(accepted)))
            if execution.get("cached") is not None:
                to_cache.append((execution["cached"] - max(accepted or moments)) * 1000.0)
                after_cache.append(_answer_lag(execution["polls"], execution["cached"]))
                if execution["polls"][0][0] < execution["cached"]:
                    polled_before.append(after_cache[-1])
                # The CPU the answering poll took (its loop's thread, the process) and its path.
                _began, _returned, _done, loop_cpu, process_cpu, was_handed_off = next(
                    p for p in execution["polls"] if p[2])
                after_cache_cpu["loop"].append(loop_cpu)
                after_cache_cpu["process"].append(process_cpu)
                waited[bool(was_handed_off)].append(after_cache[-1])
        summary = _lane_summary(server, report, failure, lags, errors, time.time() - launched, launched)
        if client_lags:
            # The same answer lag counted from when the API server accepted the last Ready write.
            summary["client_lag_ms"] = summarize(client_lags, 1)
        if after_cache:
            # That lag split in two at the moment the client's pod cache held the cluster's workers Ready.
            summary["to_cache_ms"] = summarize(to_cache, 1)
            summary["answer_after_cache_ms"] = summarize(after_cache, 1)
            if polled_before:
                summary["answer_after_cache_polled_before_ms"] = summarize(polled_before, 1)
        if after_cache_cpu["loop"]:
            # Of the answering poll's wall time, the CPU the loop's thread spent on it and the CPU the
            # whole process spent meanwhile: the rest is time no core ran this process.
            summary["answer_cpu_ms"] = {where: summarize(ms, 2) for where, ms in after_cache_cpu.items()}
            summary["answer_after_cache_by_path_ms"] = {
                path: summarize(ms, 1) for path, ms in (("on_the_loop", waited[False]), ("waited", waited[True])) if ms
            }
        if (report or {}).get("cache_misses"):
            summary["polls_handed_to_a_thread"] = report["cache_misses"]
        pauses = (report or {}).get("gc_pauses") or []
        if pauses:
            summary["gc_pauses"] = {
                "count": len(pauses), "full": sum(1 for generation, _ in pauses if generation == 2),
                "ms": summarize([ms for _, ms in pauses], 2),
            }
        polls = sum(len(e["polls"]) for e in (report or {}).get("executions", []))
        summary["load_average_1m_start_end"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
        summary["connector_polls"] = polls
        summary["connections_opened"] = (report or {}).get("connections_opened")
        if polls:
            summary["requests_per_poll"] = round(summary["requests"]["total"] / polls, 3)
        if first is not None:
            later = sum(1 for e in (report or {}).get("executions", []) for p in e["polls"] if p[0] >= first[0])
            after = _requests(server, skip=first[1])
            summary["after_first_polls"] = {"polls": later, "requests": after}
            summary["requests_per_poll_after_first"] = round(after["total"] / later, 4) if later else None
        return summary


def _say(child: "subprocess.Popen[str]", line: str) -> None:
    if child.stdin:
        child.stdin.write(line + "\n")
        child.stdin.flush()


def _answer_lag(polls: List[List[float]], ready: float) -> float:
    """How long after ``ready`` (or after the start of the first poll begun since, if that one already
    answered SUCCEEDED) the first SUCCEEDED answer returned, in ms: the answer's lag, not the poll interval."""
    first_after = next((p for p in polls if p[0] >= ready), None)
    done = next(p for p in polls if p[2])
    start = ready if first_after is None or not first_after[2] else first_after[0]
    return (done[1] - start) * 1000.0


def _lane_summary(server: Any, report: Optional[Dict[str, Any]], failure: str, lags: List[float], errors: List[str],
                  seconds: float, launched: float) -> Dict[str, Any]:
    summary = {
        "completed": len(lags),
        "failure": failure or None,
        "errors": errors[:10],
        "error_count": len(errors),
        "lag_ms": summarize(lags, 1) if lags else None,
        "peak_rss_mb": round(report["peak_rss_kb"] / 1024.0, 1) if report else None,
        "peak_open_watches": server.peak_watches,
        "peak_watches_per_resource": server.peak_watches_per_resource,
        "requests": _requests(server),
        "wall_s": round(seconds, 1),
    }
    if hasattr(server, "ready_write_ms"):
        writes = server.ready_write_ms(since=launched)
        # The real server's part of every lag: the kubelet's Ready write, sent until the API server accepted it.
        summary["ready_write_ms"] = summarize(writes, 1) if writes else None
        summary["server_ms"] = server.server_ms()
    return summary


def run(
    quick: bool = False, out_dir: Path = Path("benchmarks/results"), server: str = "test-server",
    paths: Tuple[str, ...] = PATHS, raw_stem: Optional[str] = None,
) -> BenchResult:
    """Both designs, through the backend and through the connector (``paths``: either alone), on fresh
    servers of the same size (``server="envtest"``: the shared design only, on a real kube-apiserver;
    skipped, saying what to set, where it cannot start). The shared connector lane's raw polls go to
    ``<out_dir>/<raw_stem>_polls.json.gz`` (``raw_stem``: the result's name by default)."""
    if server not in SERVERS:
        raise ValueError(f"server must be one of {', '.join(SERVERS)}, not {server!r}")
    if not paths or set(paths) - set(PATHS):
        raise ValueError(f"paths must be some of {', '.join(PATHS)}, not {paths!r}")
    name, title = SERVERS[server], TITLES[server]
    try:
        import flytekitplugins_ddlscale.backends.kubernetes  # noqa: F401
        import tests.servers.k8s_server  # noqa: F401
    except ImportError as exc:
        return BenchResult.skipped(name, title, f"kubernetes backend or its test server not importable: {exc}")
    plan = QUICK if quick else FULL
    lanes: Dict[str, Dict[str, Any]] = {}
    raw: List[Dict[str, Any]] = []
    if server == "envtest":
        from benchmarks import real_k8s

        why = real_k8s.missing()
        if why:
            return BenchResult.skipped(name, title, why)
        missing = "previous design: measured on the test server only (fleet_k8s)"
        with tempfile.TemporaryDirectory(prefix="ddlscale-fleet-") as tmp, real_k8s.control_plane() as envtest:
            if "backend" in paths:
                lanes["backend_shared"] = _backend_lane(plan, None, envtest)
            if "connector" in paths:
                lanes["connector_shared"] = _connector_lane(plan, None, Path(tmp), envtest, raw)
    else:
        with tempfile.TemporaryDirectory(prefix="ddlscale-fleet-") as tmp:
            previous, missing = export(Path(tmp) / "previous")
            if "backend" in paths:
                lanes["backend_shared"] = _backend_lane(plan, None)
                if previous is not None:
                    lanes["backend_per_wait"] = _backend_lane(plan, previous)
            if "connector" in paths:
                lanes["connector_shared"] = _connector_lane(plan, None, Path(tmp), raw=raw)
                if previous is not None:
                    lanes["connector_per_poll"] = _connector_lane(plan, previous, Path(tmp))
    result = BenchResult(name, title)
    if missing:
        result.notes.append(missing)
    if raw:
        result.files.append(_write_raw(out_dir / f"{raw_stem or name}_polls.json.gz", raw).name)
    result.metrics = {
        "plan": {"clusters": plan.clusters, "replicas": f"1 -> {plan.replicas}", "ready_delay_s": plan.ready_delay,
                 "connector_poll_s": plan.poll, "previous_design": missing or f"git {PREVIOUS}", "server": server},
        **lanes,
        "headline": [_headline(name, lane, plan.clusters) for name, lane in lanes.items()],
    }
    watch_limit = float(NAMESPACES * RESOURCES)
    for name in [lane for lane in ("backend_shared", "connector_shared") if lane in lanes]:
        lane = lanes[name]
        lag = lane["lag_ms"]
        result.targets.append(Target(f"{name}: waits completed", float(lane["completed"]), float(plan.clusters), "waits", ">="))
        result.targets.append(Target(f"{name}: detection lag p95", lag["p95"] if lag else None, LAG_LIMIT_MS, "ms",
                                     detail=f"median {lag['median']} ms" if lag else (lane["failure"] or "none completed")))
        result.targets.append(Target(f"{name}: peak RSS", lane["peak_rss_mb"], RSS_LIMIT_MB, "MB"))
        result.targets.append(Target(f"{name}: open watches per resource (peak)",
                                     float(lane["peak_watches_per_resource"]), 1.0, "watches",
                                     detail=f"{lane['peak_open_watches']} in all (limit {watch_limit:.0f}: "
                                            f"namespaces x resources); {lane['requests']['total']} API requests in all"))
    for name, limit in (("backend_shared", CLIENT_LAG_LIMIT_MS), ("connector_shared", ANSWER_LAG_LIMIT_MS)):
        if name not in lanes:
            continue
        client = lanes[name].get("client_lag_ms")
        if server == "envtest":
            result.targets.append(Target(
                f"{name}: lag after the server accepted the Ready write, p95", client["p95"] if client else None,
                limit, "ms", detail=f"median {client['median']} ms" if client else "not measured"))
    if "connector_shared" not in lanes:
        return result
    connector = lanes["connector_shared"]
    after_cache = connector.get("answer_after_cache_ms")
    if after_cache:
        to_cache = connector["to_cache_ms"]
        result.targets.append(Target(
            "connector_shared: lag after the pod cache held the Ready workers (what the client adds), p95",
            after_cache["p95"], CLIENT_LAG_LIMIT_MS, "ms",
            detail=f"median {after_cache['median']} ms; before it, write accepted (or sent) to cache: "
                   f"p95 {to_cache['p95']} ms, median {to_cache['median']} ms; executions that had polled "
                   f"before their cache held the workers Ready: {_brief(connector.get('answer_after_cache_polled_before_ms'))}"))
    result.targets.append(Target("connector_shared: API requests per poll after the first",
                                 connector.get("requests_per_poll_after_first"), REQUESTS_PER_POLL_LIMIT, "requests",
                                 detail=f"{connector.get('after_first_polls')}; connections opened "
                                        f"{connector.get('connections_opened')}"))
    return result


def _brief(figures: Optional[Dict[str, Any]]) -> str:
    return f"{figures['n']}, p95 {figures['p95']} ms" if figures else "none"


def _write_raw(path: Path, rows: List[Dict[str, Any]]) -> Path:
    """Write ``rows`` as gzipped JSON at ``path``; the path."""
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as out:
        json.dump({"polls_are": ["began", "returned", "done", "loop_cpu_ms", "process_cpu_ms", "waited"],
                   "executions": rows}, out)
    return path


def _headline(name: str, lane: Dict[str, Any], clusters: int) -> str:
    lag = lane["lag_ms"]
    lag_text = f"lag p95 {lag['p95']} ms" if lag else f"no lag ({lane['failure'] or 'none completed'})"
    return (f"{name}: {lane['completed']}/{clusters} in {lane['wall_s']} s; {lag_text}; peak RSS {lane['peak_rss_mb']} MB; "
            f"peak open watches {lane['peak_open_watches']}; {lane['requests']['total']} API requests")


def main() -> None:
    """``python -m benchmarks.bench_fleet --clusters N [--server envtest] [--only backend|connector]``: the
    full plan at another size (one path alone), written to ``results/fleet_k8s[_envtest]_<N>[_<path>].json``
    (the suite's ``fleet_k8s`` is the 1,000-cluster run of both paths)."""
    import argparse
    import dataclasses

    from benchmarks.report import write_json

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_fleet")
    parser.add_argument("--clusters", type=int, required=True)
    parser.add_argument("--server", choices=sorted(SERVERS), default="test-server")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--only", choices=PATHS, help="measure one path (default: both)")
    args = parser.parse_args()
    global FULL
    FULL = dataclasses.replace(FULL, clusters=args.clusters)
    started = time.monotonic()
    name = f"{SERVERS[args.server]}_{args.clusters}" + (f"_{args.only}" if args.only else "")
    result = run(quick=False, out_dir=args.out, server=args.server, paths=(args.only,) if args.only else PATHS,
                 raw_stem=name)
    result.name = name
    document = result.to_json(quick=False, duration_s=time.monotonic() - started)
    write_json(args.out / f"{result.name}.json", document)
    print("\n".join(document["metrics"]["headline"]))


if __name__ == "__main__":
    main()
