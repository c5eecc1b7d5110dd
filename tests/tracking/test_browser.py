"""The MLflow UI in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``make install`` through scripts/install-browser.sh)
driven by Selenium logs in (MLflow's basic auth: the session's tracking credential, sent
as an ``Authorization`` header on every request of the page) and opens a run's metric
charts on the test's ``mlflow server``; the AUC chart is on the page. The screenshot is saved under the test's output directory
(``<tmp_path>/mlflow-run.png``; also copied to ``runs/browser/`` when that directory is
writable, for a person to look at)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from runtime import tracking

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parents[2]


def _driver():
    from tests import tools

    tools.need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
              "--disable-dev-shm-usage"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def test_the_run_page_shows_the_auc_chart(mlflow_server, tmp_path):
    """A real continuous job (3 hourly partitions, single process) logs to the server; its
    run's metric charts show the next-hour AUC (``auc_before``)."""
    from runtime.trainer import generator
    from tests.trainer.test_online import START, _run, _summary

    generator.generate_hours(tmp_path / "hours", 3, START, 2000, seed=7)
    state = tmp_path / "state"
    _summary(_run(["--single", "--mode", "continuous", "--data-root", str(tmp_path / "hours"), "--start-hour",
                   START, "--end-hour", "20261120/02", "--state-dir", str(state), "--poll-seconds", "0.2",
                   "--threads", "1", "--tracking-uri", mlflow_server.url], tmp_path))
    rec = tracking.RunIdFile(str(state), "job").record()  # the job's run holds auc_before
    url = mlflow_server.metrics_url(rec["experiment_id"], rec["run_id"])
    from selenium.webdriver.common.by import By

    import base64

    user, password = mlflow_server.login()  # the server runs MLflow's basic auth: the browser logs in
    drv = _driver()
    try:
        login = base64.b64encode(f"{user}:{password}".encode()).decode()
        drv.execute_cdp_cmd("Network.enable", {})
        drv.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {login}"}})
        drv.get(url)
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            text = drv.find_element(By.TAG_NAME, "body").text
            # the chart card is titled by the metric's name; its plot is an SVG/canvas element
            plots = drv.find_elements(By.CSS_SELECTOR, "svg.main-svg, canvas, .js-plotly-plot")
            if "auc_before" in text and plots:
                break
            time.sleep(1)
        time.sleep(2)  # let the plot finish drawing for the screenshot
        shot = tmp_path / "mlflow-run.png"
        drv.save_screenshot(str(shot))
    finally:
        drv.quit()
    assert "Can't load run details" not in text, text[:2000]
    assert "auc_before" in text, text[:2000]
    assert plots, "no chart element on the run's metrics page"
    assert shot.stat().st_size > 10_000
    keep = REPO / "runs" / "browser"
    try:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / "mlflow-run.png")
    except OSError:
        pass
