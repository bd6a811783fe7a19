"""Kubernetes pod labels on a running exporter's series, from a fake kubelet serving the
real pod-resources protocol, through to Prometheus."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support import REPO, Exporter, parse_samples, start_exporter, wait_for
from tests.support.kubelet import KubeletServer, container, pod, response

if TYPE_CHECKING:
    from tests.support.prometheus import Prometheus

UNATTRIBUTED = {(None, None, None)}


def test_a_pod_requesting_a_gpu_shows_on_that_gpus_series_and_follows_pod_churn(
    tmp_path: Path, kubelet: KubeletServer
) -> None:
    exp = serve(tmp_path, kubelet.socket)
    try:
        gpu = uuids(exp)
        kubelet.kubelet.listed = response(
            pod("ml", "trainer-0",
                container("pytorch", ("nvidia.com/gpu", [gpu["1"]]),
                          ("vpc.amazonaws.com/efa", ["0"]))),
            pod("kube-system", "aws-node-x", container("aws-node")),
        )  # fmt: skip
        wait_for(lambda: owners(exp) == {
            "0": UNATTRIBUTED, "1": {("trainer-0", "ml", "pytorch")}
        })  # fmt: skip
        assert kubernetes_health(exp) == (1.0, None)
        # every GPU series of GPU 1 carries the labels, none of GPU 0's does
        series = gpu_series(exp)
        assert sum(lbl["gpu"] == "1" for lbl in series) > 20

        # the job's pod is replaced (rescheduled as trainer-1, on GPU 0 this time) and
        # another workload takes GPU 1
        kubelet.kubelet.listed = response(
            pod("ml", "trainer-1", container("pytorch", ("nvidia.com/gpu", [gpu["0"]]))),
            pod("infer", "llm-0", container("server", ("nvidia.com/gpu", [gpu["1"]]))),
        )
        wait_for(lambda: owners(exp) == {
            "0": {("trainer-1", "ml", "pytorch")}, "1": {("llm-0", "infer", "server")}
        })  # fmt: skip
        kubelet.kubelet.listed = response()  # every pod gone
        wait_for(lambda: owners(exp) == {"0": UNATTRIBUTED, "1": UNATTRIBUTED})
    finally:
        assert exp.stop() == 0


def test_a_kubelet_that_goes_away_costs_the_labels_and_a_failing_source_only(
    tmp_path: Path, kubelet: KubeletServer
) -> None:
    exp = serve(tmp_path, kubelet.socket)
    try:
        gpu = uuids(exp)
        kubelet.kubelet.listed = response(
            pod("ml", "trainer-0", container("pytorch", ("nvidia.com/gpu", [gpu["0"]])))
        )
        attributed = {"0": {("trainer-0", "ml", "pytorch")}, "1": UNATTRIBUTED}
        wait_for(lambda: owners(exp) == attributed)
        kubelet.stop()
        wait_for(lambda: owners(exp) == {"0": UNATTRIBUTED, "1": UNATTRIBUTED})
        success, error = kubernetes_health(exp)
        assert success == 0.0 and error and str(kubelet.socket) in error
        # the GPUs themselves are still served, in full
        fams = parse_samples(exp.metrics())
        assert {lbl["gpu"] for lbl, _ in fams["DCGM_FI_DEV_GPU_UTIL"]} == {"0", "1"}
        # the kubelet restarts: the labels come back without restarting the exporter
        kubelet.start()
        wait_for(lambda: owners(exp) == attributed)
        assert kubernetes_health(exp) == (1.0, None)
    finally:
        assert exp.stop() == 0


def test_a_kubelet_that_never_answers_holds_up_no_scrape(
    tmp_path: Path, kubelet: KubeletServer
) -> None:
    kubelet.kubelet.hang.set()
    exp = serve(tmp_path, kubelet.socket)
    try:
        wait_for(lambda: kubelet.kubelet.calls >= 1)
        # while the List call hangs (up to its 5 s deadline), every scrape answers at once
        # and the passes go on
        latencies: list[float] = []
        passes: set[float] = set()

        def scrape() -> bool:
            t0 = time.monotonic()
            fams = parse_samples(exp.metrics())
            latencies.append(time.monotonic() - t0)
            passes.add(fams["stepscope_last_collect_timestamp_seconds"][0][1])
            return len(passes) >= 5  # several passes published during the hung call

        wait_for(scrape, timeout=4)
        assert kubelet.kubelet.calls == 1, "the first List call was still hanging"
        assert max(latencies) < 2.5, f"a scrape took {max(latencies):.2f} s"
        assert owners(exp) == {"0": UNATTRIBUTED, "1": UNATTRIBUTED}
        # the health says the kubelet did not answer in time
        wait_for(lambda: (h := kubernetes_health(exp))[0] == 0.0 and "DEADLINE" in (h[1] or ""),
                 timeout=20)
    finally:
        assert exp.stop() == 0


def test_without_grpcio_a_configured_attribution_is_one_line_and_exit_2(
    tmp_path: Path, kubelet: KubeletServer
) -> None:
    """The rule for optional features (issue 36): one configured that cannot start is an
    error naming what to install, not a source that fails at every pass."""
    # a grpc package that cannot be imported shadows the installed one
    blocked = tmp_path / "blocked"
    (blocked / "grpc").mkdir(parents=True)
    (blocked / "grpc" / "__init__.py").write_text("raise ImportError('grpc blocked by the test')\n")
    with pytest.raises(AssertionError, match="exporter did not start") as failed:
        serve(tmp_path, kubelet.socket, env={"PYTHONPATH": str(blocked)})
    lines = [line for line in str(failed.value).splitlines()[1:] if line.strip()]
    assert len(lines) == 1, lines
    assert "pip install 'stepscope[kubernetes]'" in lines[0]
    assert "Traceback" not in str(failed.value)


OPERATOR_VARIANTS = {"chart": True, "without-labeldrop": False}  # podResources.enabled


def _service_monitor_endpoint(attribution: bool) -> dict[str, Any]:
    from tests.support.chart import one, rendered_objects

    objs = rendered_objects({"podResources": {"enabled": attribution}, "cluster": "c1"})
    (endpoint,) = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert isinstance(endpoint, dict)
    return endpoint


@contextlib.contextmanager
def _operator_scraped(tmp: Path, attribution: bool) -> Iterator[tuple[Exporter, Prometheus]]:
    """A node's exporter (its own fake kubelet, a pod holding GPU 0), scraped by a
    Prometheus as the Operator scrapes the chart's ServiceMonitor rendered with
    podResources.enabled = ``attribution``."""
    from tests.support.kubelet import running_kubelet
    from tests.support.prometheus import Prometheus

    relabel = [_prometheus_relabeling(r)
               for r in _service_monitor_endpoint(attribution)["relabelings"]]  # fmt: skip
    kubelets = running_kubelet(tmp)
    kubelet = next(kubelets)
    exp = serve(tmp, kubelet.socket)
    prom = None
    try:
        gpu = uuids(exp)
        kubelet.kubelet.listed = response(
            pod("ml", "trainer-0", container("pytorch", ("nvidia.com/gpu", [gpu["0"]]))))
        wait_for(lambda: owners(exp)["0"] == {("trainer-0", "ml", "pytorch")})
        # the target labels the Operator gives the target before the monitor's relabelings
        operator_target = {"namespace": "monitoring", "pod": "stepscope-x7k2p",
                           "container": "stepscope"}
        prom = Prometheus(tmp, [exp.address], REPO / "deploy" / "prometheus" / "rules",
                          static_configs=[{"targets": [exp.address], "labels": operator_target}],
                          relabel_configs=relabel)
        yield exp, prom
    finally:
        if prom is not None:
            prom.stop()
        assert exp.stop() == 0
        next(kubelets, None)  # stops the kubelet


@pytest.fixture(scope="module")
def operator_scraped(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[Exporter, Prometheus]]]:
    """Both variants, started together: each waits on its Prometheus' first scrapes
    (~5 s), so the two waits overlap."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(
                   _operator_scraped(tmp_path_factory.mktemp(f"k8s-{name}"), attribution))
               for name, attribution in OPERATOR_VARIANTS.items()}  # fmt: skip


@pytest.mark.parametrize("variant", list(OPERATOR_VARIANTS))
def test_the_workloads_pod_labels_reach_prometheus_under_the_charts_scrape_config(
    variant: str, operator_scraped: dict[str, tuple[Exporter, Prometheus]]
) -> None:
    """The Prometheus Operator gives every target of a ServiceMonitor the labels pod,
    namespace and container of the scraped pod (the exporter's own). With honor_labels
    false, as shipped, a GPU series' pod label of the workload then becomes exported_pod
    and every "which pod is on this GPU" query finds nothing. The chart's scrape drops
    those target labels; without that step the labels are renamed, as here."""
    attribution = OPERATOR_VARIANTS[variant]
    assert _service_monitor_endpoint(attribution)["honorLabels"] is False
    _, prom = operator_scraped[variant]

    def stored() -> list[dict[str, str]] | None:
        result = prom.api("query", query="DCGM_FI_DEV_GPU_UTIL")["result"]
        return [r["metric"] for r in result] if len(result) == 2 else None

    series = {m["gpu"]: m for m in wait_for(stored, timeout=30, interval=0.5)}
    if attribution:
        assert {k: series["0"].get(k) for k in ("pod", "namespace", "container")} == {
            "pod": "trainer-0", "namespace": "ml", "container": "pytorch"}
        assert not any(k.startswith("exported_") for m in series.values() for k in m)
        assert "pod" not in series["1"], "a GPU no pod holds carries no pod label"
        assert series["0"]["cluster"] == "c1"
    else:
        # what an Operator-made target does to the workload's labels
        assert series["0"]["exported_pod"] == "trainer-0"
        assert series["0"]["pod"] == series["1"]["pod"] == "stepscope-x7k2p"


def serve(tmp_path: Path, sock: Path, env: dict[str, str] | None = None) -> Exporter:
    return start_exporter(
        ["--simulate", "2", "--hostname", "k8s-node", "--interval", "0.2",
         "--slow-interval", "0.5", "--ingest", f"unix://{tmp_path}/ingest.sock",
         "--kubernetes-pod-resources", str(sock)],
        env,
    )  # fmt: skip


def gpu_series(exp: Exporter) -> list[dict[str, str]]:
    """Label sets of every GPU series (those with the GPU's own pci_bus_id label)."""
    fams = parse_samples(exp.metrics())
    return [lbl for samples in fams.values() for lbl, _ in samples if "pci_bus_id" in lbl]


def uuids(exp: Exporter) -> dict[str, str]:
    """GPU index -> UUID, as the exporter serves them."""
    samples = parse_samples(exp.metrics())["DCGM_FI_DEV_GPU_UTIL"]
    return {lbl["gpu"]: lbl["UUID"] for lbl, _ in samples}


def owners(exp: Exporter) -> dict[str, set[tuple[str | None, str | None, str | None]]]:
    """GPU index -> the (pod, namespace, container) values its series carry."""
    out: dict[str, set[tuple[str | None, str | None, str | None]]] = {}
    for lbl in gpu_series(exp):
        out.setdefault(lbl["gpu"], set()).add(
            (lbl.get("pod"), lbl.get("namespace"), lbl.get("container"))
        )
    return out


def kubernetes_health(exp: Exporter) -> tuple[float | None, str | None]:
    """(stepscope_collector_success, last_error) of the kubernetes source."""
    fams = parse_samples(exp.metrics())
    success = {lbl["collector"]: v for lbl, v in fams["stepscope_collector_success"]}
    _, _, body = exp.get("/api/v1/diagnosis")
    source = json.loads(body)["sources"].get("kubernetes", {})
    return success.get("kubernetes"), source.get("last_error")


def _prometheus_relabeling(operator: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus Operator RelabelConfig as the relabel_config Prometheus runs."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): (str(v).lower() if k == "action" else v)
            for k, v in operator.items()}
