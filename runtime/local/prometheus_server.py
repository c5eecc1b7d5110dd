"""A Prometheus run by the project on 127.0.0.1 (Debian's ``prometheus`` binary,
scripts/install-prometheus.sh): the local pipeline's (``elastic-ctr local --prometheus``)
and the live monitoring test's. It is a role of a ``runtime.proc.ProcessGroup``: started
by ``launch`` and stopped by PID with the group.

Its directory holds ``prometheus.yml`` (one scrape job, ``elastic-ctr``, over the file-SD
target files ``targets/*.json`` that the launchers write: ``runtime.local.targets``,
each target carrying its ``job``), ``rules.yaml`` (``runtime.metrics.rules``) and the
TSDB (``data/``). ``--web.enable-lifecycle`` is on so ``set_rules`` can reload new
thresholds. The HTTP API (``query``, ``query_range``, ``rules``, ``alerts``) is Prometheus'
own ``/api/v1`` (https://prometheus.io/docs/prometheus/latest/querying/api/).
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Optional

from runtime.metrics import rules as rules_mod

BINARY = "prometheus"


class PrometheusError(RuntimeError):
    """The Prometheus API answered an error (a query that does not parse, a failed
    reload) or did not answer; the message names the request."""


class PrometheusServer:
    """One local Prometheus.

    Args:
        directory: its configuration, target files, rules and TSDB.
        group: the ``ProcessGroup`` it runs in.
        scrape_interval_s / evaluation_interval_s: seconds (the local pipeline's roles live
            for minutes: seconds, not Prometheus' minute).
        thresholds: the alert thresholds of its rule file.
        port: where it listens (default: a free port).
    """

    def __init__(self, directory: Path, group, scrape_interval_s: float = 2.0, evaluation_interval_s: float = 2.0,
                 thresholds: Optional[rules_mod.Thresholds] = None, port: Optional[int] = None):
        from runtime import proc

        self.dir = Path(directory)
        self.group = group
        self.scrape_interval_s, self.evaluation_interval_s = scrape_interval_s, evaluation_interval_s
        self.thresholds = thresholds or rules_mod.Thresholds()
        self.port = port or proc.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets_dir = self.dir / "targets"
        self.role = None
        self._session = None

    # -- files ----------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """``prometheus.yml``'s document."""
        return {"global": {"scrape_interval": rules_mod.duration(self.scrape_interval_s),
                           "scrape_timeout": rules_mod.duration(max(1.0, self.scrape_interval_s * 0.8)),
                           "evaluation_interval": rules_mod.duration(self.evaluation_interval_s)},
                "rule_files": [str(self.dir / "rules.yaml")],
                "scrape_configs": [{"job_name": "elastic-ctr", "file_sd_configs": [
                    {"files": [str(self.targets_dir / "*.json")], "refresh_interval": "5s"}]}]}

    def write_rules(self, thresholds: Optional[rules_mod.Thresholds] = None) -> Path:
        """Writes ``rules.yaml`` with ``thresholds`` (default the server's); returns it."""
        if thresholds is not None:
            self.thresholds = thresholds
        path = self.dir / "rules.yaml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(rules_mod.rule_file(self.thresholds))
        tmp.replace(path)
        return path

    # -- the process ----------------------------------------------------------------------
    def launch(self, binary: Optional[str] = None) -> "PrometheusServer":
        """Writes the files and starts the server (not waiting for it). Raises
        ``FileNotFoundError`` naming the install script when the binary is absent."""
        import yaml

        exe = binary or shutil.which(BINARY)
        if exe is None:
            raise FileNotFoundError(f"{BINARY}: not installed (make install, or scripts/install-prometheus.sh)")
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.write_rules()
        self.role = self.group.start("prometheus", [
            exe, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d", "--log.level=warn"])
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Blocks until ``/-/ready`` answers 200. Raises ``TimeoutError`` / ``proc.RoleFailed``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.group.check()
            try:
                if self._http().get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus at {self.url} not ready after {timeout_s:.0f} s")

    def set_rules(self, thresholds: rules_mod.Thresholds) -> None:
        """Rewrites the rule file with ``thresholds`` and reloads it (``POST /-/reload``).
        Raises ``PrometheusError`` when the reload fails."""
        self.write_rules(thresholds)
        r = self._http().post(f"{self.url}/-/reload", timeout=10)
        if r.status_code != 200:
            raise PrometheusError(f"POST {self.url}/-/reload: HTTP {r.status_code} {r.text[:300]}")

    # -- the API --------------------------------------------------------------------------
    def _http(self):
        if self._session is None:
            import requests

            self._session = requests.Session()
        return self._session

    def _get(self, path: str, params: dict) -> Any:
        import requests

        url = f"{self.url}/api/v1/{path}"
        try:
            r = self._http().get(url, params=params, timeout=30)
            body = r.json()
        except (requests.RequestException, ValueError) as exc:
            raise PrometheusError(f"GET {url} {params}: {exc}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: Optional[float] = None) -> list[dict]:
        """An instant query's ``result`` (vector samples: ``{"metric", "value": [t, "v"]}``;
        a scalar is one sample with no labels). Raises ``PrometheusError``."""
        data = self._get("query", {"query": expr, **({"time": at} if at is not None else {})})
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict]:
        """A range query's ``result`` (``{"metric", "values": [[t, "v"], ...]}`` per series).
        Raises ``PrometheusError``."""
        return self._get("query_range", {"query": expr, "start": start, "end": end, "step": step_s})["result"]

    def rules(self) -> list[dict]:
        """Every loaded rule (``health``, ``lastError``, ``state`` for alerts)."""
        return [r for g in self._get("rules", {})["groups"] for r in g["rules"]]

    def alerts(self, name: Optional[str] = None) -> list[dict]:
        """Active alerts (``labels``, ``state`` pending | firing, ``value``), of ``name`` only if given."""
        out = self._get("alerts", {})["alerts"]
        return [a for a in out if name is None or a["labels"].get("alertname") == name]

    def targets(self) -> list[dict]:
        """The active scrape targets (``labels``, ``health`` up | down | unknown, ``lastError``)."""
        return self._get("targets", {})["activeTargets"]
