"""What the generators share: where things are in a checkout, and the cluster they render
for. Paths are relative to the checkout because ``python -m generate --check`` runs the
generators on a copy of it; the tests import these too."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

DASHBOARDS_DIR = Path("dashboards")
PROMETHEUS_DIR = Path("deploy/prometheus")
CHART_DIR = Path("helm/stepscope")
MANIFESTS_DIR = Path("deploy/kubernetes")
METRICS_DOC = Path("docs/metrics.md")
# the one version number (stepscope.__version__) and the files outside the trees above that
# carry it
VERSION_FILE = Path("exporter/stepscope/__init__.py")
DOCKERFILE = Path("Dockerfile")
CHART = REPO / CHART_DIR

# The Kubernetes version the chart is linted and rendered for, and the manifests
# validated against: EKS standard support, and a version whose schemas
# kubernetes-validate ships. Helm takes it as f"v{KUBE_VERSION}".
KUBE_VERSION = "1.34.0"
# the release the plain manifests are rendered as
RELEASE = "stepscope"
NAMESPACE = "stepscope"
# the Prometheus Operator's API: with it the chart renders ServiceMonitor/PodMonitor,
# PrometheusRule and the dashboards' ConfigMaps
MONITORING_API = "monitoring.coreos.com/v1"
