"""GraphiQL in a real headless browser (Debian's chromium and chromedriver).

The page is opened as the demo prints it (the token in the address's
fragment), the example recall is run through the IDE, and the result pane must
show the recall's data. Every request the browser makes is recorded: all of
them go to the gateway. A screenshot is kept in ``test-artifacts/``.

Without chromium the test is skipped on a developer's machine and fails in CI
(``CI`` set), where ``.ci/run`` installs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from typing import Any

import httpx
import pytest

from gateway.services.writes import WriteService

from .conftest import REPO, LiveServer, load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token

ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,900",
)


def _browser() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        message = "chromium and chromedriver are needed (scripts/setup installs them as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return chromium, driver


def _run_in_browser(url: str, secret: str, shot: str) -> dict[str, Any]:
    """Open the page, run the first tab, and return what the browser saw."""
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    chromium, driver_path = _browser()
    profile = tempfile.mkdtemp(prefix="graphiql-profile-")
    options = Options()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        driver.get(f"{url}/graphql#token={secret}")
        wait = WebDriverWait(driver, 30)
        button = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".graphiql-execute-button"))
        editors_js = (
            "return Array.from(document.querySelectorAll('.CodeMirror'))"
            ".map(e => e.CodeMirror ? e.CodeMirror.getValue() : '')"
        )
        editors: list[str] = driver.execute_script(editors_js)
        button.click()
        result_js = (
            "const e = document.querySelector('.result-window .CodeMirror');"
            "return e && e.CodeMirror ? e.CodeMirror.getValue() : '';"
        )
        wait.until(lambda d: '"recallMemory"' in d.execute_script(result_js))
        time.sleep(0.5)  # let the pane finish painting for the screenshot
        driver.save_screenshot(str(ARTIFACTS / shot))
        requests = [
            event["params"]["request"]["url"]
            for entry in driver.get_log("performance")
            if (event := json.loads(entry["message"])["message"])["method"]
            == "Network.requestWillBeSent"
        ]
        return {
            "address": driver.current_url,
            "editors": editors,
            "result": json.loads(driver.execute_script(result_js)),
            "requests": requests,
            "console": [e["message"] for e in driver.get_log("browser")],
        }
    except TimeoutException:
        driver.save_screenshot(str(ARTIFACTS / ("failed-" + shot)))
        console = [e["message"] for e in driver.get_log("browser")]
        raise AssertionError(f"GraphiQL did not answer; browser console: {console}") from None
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


async def test_the_example_recall_runs_in_graphiql_offline(
    live_server: LiveServer, writes: WriteService
) -> None:
    _browser()
    team = unique("giql")
    await load_jsonl(writes, jsonl(team_records(team)))
    secret = await token(writes, team, "alice")

    seen = await asyncio.to_thread(_run_in_browser, live_server.url, secret, "graphiql-recall.png")

    # The token is in the headers pane and no longer in the address bar.
    assert any(f"Bearer {secret}" in text for text in seen["editors"])
    assert "token" not in seen["address"]
    # The example recall ran through the IDE and the result pane shows its data.
    recall = seen["result"]["data"]["recallMemory"]
    assert "errors" not in seen["result"]
    assert {r["evidenceId"] for r in recall["results"]} == {"ev-owner", "ev-private"}
    assert [r["rank"] for r in recall["results"]] == list(range(1, len(recall["results"]) + 1))
    owner = next(r for r in recall["results"] if r["evidenceId"] == "ev-owner")
    assert [rel["id"] for rel in owner["supportingRelationships"]] == ["rel-owner"]
    assert set(recall) >= {"relatedCommunities", "relatedHypotheses", "conflicts", "degradations"}
    # Every request went to the gateway: the page loads nothing from another host.
    assert seen["requests"], "the browser recorded no request"
    # (chrome:// pages are the browser's own new tab page, data: URLs inline fonts.)
    network = [u for u in seen["requests"] if u.split(":", 1)[0] in {"http", "https", "ws", "wss"}]
    others = [u for u in network if not u.startswith(live_server.url + "/")]
    assert others == [], others
    assert any("/graphiql/3.9.0/graphiql.min.js" in u for u in seen["requests"])
    # No script or style was refused by the page's Content-Security-Policy.
    assert not [m for m in seen["console"] if "Content Security Policy" in m]
    assert (ARTIFACTS / "graphiql-recall.png").stat().st_size > 10_000


@pytest.mark.parametrize("name", ["graphiql.min.js", "recall-graphiql.js"])
async def test_assets_are_served_immutable_and_unknown_names_are_not(
    client: httpx.AsyncClient, name: str
) -> None:
    response = await client.get(f"/graphiql/3.9.0/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/javascript")
    assert "immutable" in response.headers["cache-control"]
    for bad in ("LICENSE.graphiql", "..%2Fassets.json", "nothing.js"):
        assert (await client.get(f"/graphiql/3.9.0/{bad}")).status_code == 404
    assert (await client.get("/graphiql/0.0.1/graphiql.min.js")).status_code == 404
