"""The documentation site builds with ``mkdocs build --strict`` (a broken link fails it), its
reference pages cover what the code has, and it works in headless Chromium: the home page,
the navigation, the search, a generated reference page."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import ROOT

SCREENSHOT = Path("/tmp/eventbus-docs-first-tutorial.png")

pytestmark = pytest.mark.slow


def build(config_dir: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=config_dir,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT, out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strictly(site: Path) -> None:
    for page in (
        "index.html",
        "tutorials/first-pipeline/index.html",
        "how-to/production/index.html",
        "concepts/delivery/index.html",
        "performance/index.html",
    ):
        assert (site / page).is_file(), page


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "tutorials" / "first-pipeline.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


def test_the_reference_covers_the_code(site: Path) -> None:
    import typer

    from eventbus.cli import app
    from eventbus.observability._metrics import GatewayMetrics
    from eventbus.observability._prometheus import render_prometheus
    from eventbus.registry import sinks, sources, steps

    cli = (site / "reference/cli/index.html").read_text()
    root = typer.main.get_command(app)
    for name in root.list_commands(None):
        assert f"eventbus {name}" in cli, name
    schema = (site / "reference/pipeline-schema/index.html").read_text()
    for registry in (steps, sources, sinks):
        for kind in registry.names():
            assert f"<code>{kind}</code>" in schema, kind
    metrics = (site / "reference/metrics/index.html").read_text()
    exposition = render_prometheus([], GatewayMetrics()).decode()
    names = {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE")}
    assert names and all(f"<code>{n}</code>" in metrics for n in names)
    http = (site / "reference/http-api/index.html").read_text()
    assert "/v1/pipelines/{name}/events" in http and "/v1/admin/pipelines" in http
    env = (site / "reference/environment/index.html").read_text()
    assert "EVENTBUS_REDIS_URL" in env and "EVENTBUS_HOME" in env
    errors = (site / "reference/errors/index.html").read_text()
    import eventbus.errors

    assert all(f"<code>{name}</code>" in errors for name in eventbus.errors.__all__)
    assert "<code>LateEventError</code>" in errors


# -- the browser ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # started as the dashboard's browser test starts it (tests/integration/test_dashboard.py)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    assert chromium and driver_path, (
        "the browser test needs Debian's chromium and chromium-driver (make system-deps)"
    )
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1200",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    yield driver
    driver.quit()


def test_the_site_in_a_browser(served: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30, poll_frequency=0.2)

    # the home page
    browser.get(f"{served}/")
    wait.until(lambda d: d.find_element(By.TAG_NAME, "h1").text == "EventBus")

    # the navigation: the Tutorials tab opens the first tutorial
    tab = next(
        a
        for a in browser.find_elements(By.CSS_SELECTOR, "a.md-tabs__link")
        if a.text == "Tutorials"
    )
    tab.click()
    wait.until(
        lambda d: d.find_element(By.TAG_NAME, "h1").text == "Your first pipeline in five minutes"
    )
    assert browser.current_url.rstrip("/").endswith("tutorials/first-pipeline")
    article = browser.find_element(By.CSS_SELECTOR, "article").text
    assert "eventbus deploy examples/payments/payments.yaml" in article
    browser.save_screenshot(str(SCREENSHOT))

    # the search finds the dead letters
    box = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.click()
    box.send_keys("dead letter")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "li.md-search-result__item"))
    results = browser.find_element(By.CSS_SELECTOR, ".md-search-result").text.lower()
    assert "dead" in results and "letter" in results, results[:500]

    # a generated reference page renders its table
    browser.get(f"{served}/reference/metrics/")
    wait.until(lambda d: d.find_element(By.TAG_NAME, "h1").text == "Metrics reference")
    cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "table td code")]
    assert "eventbus_events_in_total" in cells and "eventbus_dead_letters_total" in cells
