"""A healthy busy H200, as it really served, through the shipped alert rules: nothing fires.

docs/validation/h200-2026-12-02/metrics_bf16_matmul.txt is what the exporter served on a
real H200 running a bf16 matmul loop (SM active 0.96, 692 W at its 700 W cap, clock event
reasons 4 = software power cap). Every sample becomes a promtool input series held for 40
minutes at a 15 s scrape; counters rise as they did on that GPU: the power violation
counter by 1 s per second (the GPU is capped all the time, the reason the old
StepscopeGpuPowerCapped fired on every busy GPU), the energy counter at 692 W. The dump
predates the power-limit fields, so the H200's enforced and default limits (700 W each,
as NVML reported them on that machine) are added. The shipped rules then evaluate for 40
minutes and no alert may fire but StepscopeIngestDown (that run's exporter had no
ingest socket: true, and proof that the replay is evaluated). The rules before issue 25
fire StepscopeGpuPowerCapped here. (The live run on the GPU, `python -m
validation.gpu_healthy_alerts`, fired nothing, not even pending, on 2026-12-05:
docs/validation/h200-2026-12-05/. This replay keeps what the GPU served honest against
every later rule change, on CI, with no GPU.)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.support import REPO, promtool

DUMP = REPO / "docs" / "validation" / "h200-2026-12-02" / "metrics_bf16_matmul.txt"
RULES = REPO / "deploy" / "prometheus" / "rules"
SCRAPE = 15  # seconds
MINUTES = 40
TARGET = 'cluster="validation",instance="h200:9400",job="stepscope"'
# counters that moved on the busy GPU, per second of the run
RISING = {
    "DCGM_FI_DEV_POWER_VIOLATION": 1e9,  # ns: capped every second
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 692.0e3,  # mJ at 692 W
    "process_cpu_seconds_total": 0.01,
    "stepscope_gpu_sample_cpu_seconds_total": 0.005,
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def _series() -> list[dict[str, str]]:
    text = DUMP.read_text()
    steps = MINUTES * 60 // SCRAPE
    out = []
    gpu_labels = ""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, line
        name, labels, value = m.group(1), (m.group(2) or "{}")[1:-1], float(m.group(3))
        if name == "DCGM_FI_DEV_POWER_USAGE":
            gpu_labels = labels
        labels = f"{labels},{TARGET}" if labels else TARGET
        rise = RISING.get(name, 0.0) * SCRAPE
        values = f"{value:.17g}+{rise:.17g}x{steps}" if rise else f"{value:.17g}x{steps}"
        out.append({"series": f"{name}{{{labels}}}", "values": values})
    assert gpu_labels, "the dump has no GPU"
    for name in ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF"):
        out.append({"series": f"{name}{{{gpu_labels},{TARGET}}}", "values": f"700x{steps}"})
    out.append({"series": f"up{{{TARGET}}}", "values": f"1x{steps}"})
    return out


def _alert_names() -> list[str]:
    """Every shipped alert that can page or warn: StepscopeWatchdog (severity none) fires
    always, by design, and is left out."""
    names = []
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names += [r["alert"] for r in group["rules"]
                      if "alert" in r and r.get("labels", {}).get("severity") != "none"]
    assert "StepscopeWatchdog" not in names
    return names


def test_a_healthy_h200_at_its_power_cap_fires_no_shipped_alert(tmp_path: Path) -> None:
    names = _alert_names()
    assert "StepscopeGpuPowerCapped" in names and "StepscopeGpuThermalViolation" in names
    checks = [
        {"eval_time": f"{minute}m", "alertname": name, "exp_alerts": []}
        for minute in (5, 15, 25, MINUTES)
        for name in names
    ]
    spec = {
        "rule_files": [str(p) for p in sorted(RULES.glob("*.yml"))],
        "evaluation_interval": f"{SCRAPE}s",
        "tests": [{"interval": f"{SCRAPE}s", "input_series": _series(),
                   "alert_rule_test": checks}],
    }  # fmt: skip
    test_file = tmp_path / "healthy_h200_test.yml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", str(test_file)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    # promtool names each alert that fired where none was expected
    fired = set(re.findall(r"alertname: (\w+), time:", result.stdout + result.stderr))
    # that run's exporter could not bind its ingest socket (stepscope_ingest_up 0): the
    # one alert that must fire, which also shows the replay is evaluated at all
    assert fired == {"StepscopeIngestDown"}, result.stdout[-4000:] + result.stderr[-2000:]
