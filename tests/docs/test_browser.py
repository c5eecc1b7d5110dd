"""The documentation site in a real browser, opened from ``file://`` as the README says
(headless Chromium driven by Selenium; tests/tools.py skips without it outside ``make
test``): a link leads to its page, the search runs offline and finds a stack key, a
runbook anchor opens at its section, the stack keys do not wrap and have their own
anchors, and no code block or reference table scrolls sideways in a 1400 px window.

Screenshots of what it checks are saved under the test's directory and, when
``ELASTIC_CTR_SITE_SHOTS`` names a directory, there too (for a person to look at)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import tools

ROOT = Path(__file__).resolve().parents[2]
SHOTS_ENV = "ELASTIC_CTR_SITE_SHOTS"
WIDTH, HEIGHT = 1400, 1000
#: pages whose tables must fit the content column (the reference pages and the figures)
TABLE_PAGES = ("reference/configuration.html", "reference/package.html", "benchmarks.html", "deploy.html")
#: code blocks (pre > code) and tables wider than what holds them: [tag, scroll width, width, text]
OVERFLOW = """return Array.from(document.querySelectorAll(arguments[0])).filter(
  e => e.scrollWidth > e.clientWidth + 1).map(e => [e.tagName, e.scrollWidth, e.clientWidth,
  (e.innerText || '').slice(0, 80)]);"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> list[Path]:
    """Directories a screenshot is saved to."""
    dirs = [tmp_path_factory.mktemp("site-shots")]
    if os.environ.get(SHOTS_ENV):
        Path(os.environ[SHOTS_ENV]).mkdir(parents=True, exist_ok=True)
        dirs.append(Path(os.environ[SHOTS_ENV]))
    return dirs


@pytest.fixture(scope="module")
def browser():
    tools.need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(tools.CHROMIUM)
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},{HEIGHT}",
              "--disable-dev-shm-usage"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(str(tools.CHROMEDRIVER)), options=opts)
    yield drv
    drv.quit()


def _open(browser, site: Path, page: str) -> None:
    browser.get((site / page).as_uri() if "#" not in page
                else (site / page.split("#")[0]).as_uri() + "#" + page.split("#")[1])
    _wait(lambda: browser.execute_script("return document.readyState") == "complete", 20, f"{page} loads")


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not after {timeout_s} s: {what}")


def _shot(browser, shots: list[Path], name: str) -> None:
    first = shots[0] / name
    browser.save_screenshot(str(first))
    for d in shots[1:]:
        shutil.copy(first, d / name)


def test_home_opens_from_file_and_its_links_lead_to_pages(browser, site, shots):
    from selenium.webdriver.common.by import By

    _open(browser, site, "index.html")
    assert browser.title.startswith("elastic-ctr")
    _shot(browser, shots, "home.png")
    hrefs = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "a")]
    local = [h for h in hrefs if h and h.startswith("file://")]
    assert local and not [h for h in local if h.split("#")[0].endswith("/")], "directory links do not open from file://"
    browser.find_element(By.CSS_SELECTOR, f'.md-content a[href="getting-started.html"]').click()
    _wait(lambda: browser.current_url.endswith("/getting-started.html"), 10, "the link opens its page")
    assert browser.find_element(By.TAG_NAME, "h1").text.strip() != ""
    assert "Index of" not in browser.find_element(By.TAG_NAME, "body").text  # not a directory listing


def test_search_runs_offline_and_finds_a_stack_key(browser, site, shots):
    from selenium.webdriver.common.by import By

    _open(browser, site, "index.html")
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys("servingMaxReplicas")
    items = _wait(lambda: browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item"), 30,
                  "search results (the offline index through the iframe worker)")
    _shot(browser, shots, "search-results.png")
    links = [i.find_element(By.TAG_NAME, "a").get_attribute("href") for i in items]
    assert any("reference/configuration.html" in l for l in links), links
    target = next(i for i, l in zip(items, links) if "reference/configuration.html" in l)
    target.find_element(By.TAG_NAME, "a").click()
    _wait(lambda: "reference/configuration.html" in browser.current_url, 10, "the result opens its page")
    assert "servingMaxReplicas" in browser.find_element(By.TAG_NAME, "body").text


def test_stack_keys_do_not_wrap_and_have_their_own_anchor(browser, site, shots):
    from selenium.webdriver.common.by import By

    _open(browser, site, "reference/configuration.html#servingMaxReplicas")
    _shot(browser, shots, "stack-configuration.png")
    cells = browser.find_elements(By.CSS_SELECTOR, ".md-content td:first-child code")
    assert len(cells) > 100
    wrapped = browser.execute_script(
        "return arguments[0].filter(e => e.getClientRects().length > 1).map(e => e.innerText);", cells)
    assert wrapped == [], f"keys broken over lines: {wrapped}"
    top = browser.execute_script("return document.getElementById('servingMaxReplicas').getBoundingClientRect().top;")
    assert 0 <= top < HEIGHT / 2, top  # the anchor scrolled its row into view
    link = browser.find_element(By.CSS_SELECTOR, '.md-content td a[href="#servingReplicas"]')  # a cross-reference
    browser.execute_script("arguments[0].click();", link)
    _wait(lambda: browser.current_url.endswith("#servingReplicas"), 10, "the cross-reference opens its key")
    assert browser.find_elements(By.ID, "output-servingUrl"), "the stack outputs are listed"


def test_a_runbook_anchor_opens_at_its_section(browser, site, shots):
    from runtime.metrics import rules

    anchor = "served-data-stale"  # the freshness alert's runbook
    assert anchor in {a.anchor for a in rules.ALERTS.values()}
    _open(browser, site, f"monitoring.html#{anchor}")
    _shot(browser, shots, "runbook-anchor.png")
    top = browser.execute_script(f"return document.getElementById('{anchor}').getBoundingClientRect().top;")
    assert 0 <= top < 200, top
    _open(browser, site, "runbooks/rollback-on-a-cluster.html")
    _shot(browser, shots, "rollback-on-a-cluster.png")
    _open(browser, site, "architecture.html")
    loaded = browser.execute_script("const i = document.querySelector('.md-content img[src$=\"architecture.svg\"]');"
                                    "return i && i.complete && i.naturalWidth;")
    assert loaded and loaded > 500, "the architecture diagram is shown"
    _shot(browser, shots, "architecture.png")


def test_code_and_reference_tables_fit_the_page(browser, site, shots):
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html")
    over = {}
    for page in pages:
        _open(browser, site, page)
        code = browser.execute_script(OVERFLOW, ".md-content pre > code")
        tables = browser.execute_script(OVERFLOW, ".md-content .md-typeset__scrollwrap") if page in TABLE_PAGES else []
        if code or tables:
            over[page] = code + tables
    _open(browser, site, "reference/cli.html")
    _shot(browser, shots, "command-line.png")
    assert over == {}, over
