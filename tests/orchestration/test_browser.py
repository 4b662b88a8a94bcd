"""The Dagster UI in a real browser (Debian's headless Chromium, driven by Selenium): the partial-app
assets of a recorded deployment and their lineage, as a user sees them."""

from __future__ import annotations

import shutil

import pytest

from sp_dagster.deploy import load_app, plan_app, record
from sp_dagster.orchestration.processes import reload_code_location
from tests.fixtures.databases import require
from tests.fixtures.waiting import wait_until
from tests.orchestration.conftest import SAMPLE_APP

pytestmark = pytest.mark.slow


@pytest.fixture
def browser():
    """A headless Chromium; skipped where it is missing, except under CI (.ci/run installs it)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    require(bool(chromium and driver), "Chromium and chromedriver (Debian: chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        require(False, "selenium (pip install -e '.[dev]')")
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1600,1000"):
        options.add_argument(argument)
    session = webdriver.Chrome(service=Service(driver), options=options)
    yield session
    session.quit()


def page_text(browser, url: str, *wanted: str, timeout: float = 90) -> str:
    """Open `url` and wait until the rendered page shows every `wanted` text."""
    from selenium.webdriver.common.by import By

    browser.get(url)
    body = lambda: browser.find_element(By.TAG_NAME, "body").text  # noqa: E731
    missing = lambda text: [w for w in wanted if w not in text]  # noqa: E731
    return wait_until(lambda: (text := body()) and not missing(text) and text, timeout, 1.0, lambda: f"{url} to show {missing(body())}; it shows:\n{body()}")


def test_the_ui_shows_partial_apps_with_their_lineage(live, plane, browser):
    cluster, url = live
    loaded = load_app(SAMPLE_APP)  # recorded directly: the app repository stays empty
    record(plane, loaded, plan_app(loaded))
    port = int(url.rsplit(":", 1)[1])
    assert reload_code_location("127.0.0.1", port).startswith("reloaded")

    catalog = page_text(browser, f"{url}/assets?view=flat", "filter", "average", "alert", "StockAlerts.TradeStream")
    assert "StockAlerts.LargeTradeStream.symbol" in catalog

    # A partial app's page: its metadata (parallelism, strategies, placement, SiddhiQL) and its lineage.
    # The page draws its parts as their queries answer, the metadata table last at times: wait for it all.
    metadata = ("parallelism", "round_robin <- StockAlerts.TradeStream", "field_grouping(symbol)", "placement", "volume > 100")
    overview = page_text(
        browser, f"{url}/assets/StockAlerts/filter", "Partial app StockAlerts-filter of StockAlerts", "Upstream assets", "Downstream assets", *metadata
    )
    upstream, downstream = overview.split("Upstream assets", 1)[1].split("Downstream assets", 1)
    assert "topics / StockAlerts.TradeStream" in upstream and "topics / StockAlerts.LargeTradeStream.symbol" in downstream.split("Definition")[0]
    # The lineage graph around the next group: topic -> partial app -> topic.
    page_text(browser, f"{url}/assets/StockAlerts/average?view=lineage", "average", "StockAlerts.LargeTradeS", "StockAlerts.AveragePriceStream")


def element_text(browser, url: str, xpath: str, timeout: float = 90) -> str:
    """Open `url` and wait until an element matching `xpath` is drawn; its text."""
    from selenium.webdriver.common.by import By

    browser.get(url)
    found = wait_until(
        lambda: browser.find_elements(By.XPATH, xpath),
        timeout,
        1.0,
        lambda: f"{url} to draw {xpath}; it shows:\n{browser.find_element(By.TAG_NAME, 'body').text}",
    )
    return found[0].text


def test_a_cli_deploy_appears_without_a_reload_and_a_failed_check_shows_on_the_graph_and_in_the_catalog(live, browser):
    import os
    import subprocess
    import sys

    import dagster as dg
    from dagster._core.instance.ref import InstanceRef
    from selenium.webdriver.common.by import By

    from sp_dagster.orchestration.definitions import build_definitions

    cluster, url = live
    # The catalog is open before the deploy; the CLI's deploy alone brings the partial apps into it.
    page_text(browser, f"{url}/assets?view=flat", "sp_dagster / control_plane")
    env = {**os.environ, "SP_DAGSTER_CONF": str(cluster.manager_conf)}
    deploy = subprocess.run(
        [sys.executable, "-m", "sp_dagster.cli", "deploy", str(SAMPLE_APP), "--no-wait"], env=env, capture_output=True, text=True, timeout=120
    )
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    body = lambda: browser.find_element(By.TAG_NAME, "body").text  # noqa: E731
    wait_until(lambda: "StockAlerts / filter" in body(), 90, 1.0, lambda: f"the open catalog to show the deploy (no reload); it shows:\n{body()}")

    # The health job's run, as its schedule would launch it, on the webserver's own Dagster instance; no worker
    # runs, so nothing is placed and live_worker fails.
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(cluster.root.parent / "dagster-home")))
    health = build_definitions(str(cluster.manager_conf), str(cluster.worker_conf)).get_job_def("health")
    assert health.execute_in_process(instance=instance, raise_on_error=False).success
    # The graph: the partial app's node says how many checks passed, with the failed-check mark, and links to them.
    checks = "//*[text()='Asset checks']/..//a[@href='/assets/StockAlerts/filter?view=checks']"
    shown = element_text(browser, f"{url}/assets/StockAlerts/filter?view=lineage", f"{checks}[.//*[@aria-label='close']]")
    assert shown == "1 / 3 Passed"  # live_worker and lag_not_growing failed, parallelism_advice passed
    # The catalog: the partial apps' status is their deployed version, marked as failing its checks.
    row = "//div[contains(@class, 'VirtualizedTable_row')][.//a[contains(@href, '/assets/StockAlerts/filter')]][.//*[@aria-label='check_failed']]"
    assert "Materialized" in element_text(browser, f"{url}/assets?view=flat", row)
