"""The service recipe's page, in a real headless Chromium (Debian's), driven by Playwright.

The page lists the service's jobs, shows every job's state live (one server-sent
event stream, ``/events``) and follows one job's transitions and log live
(``/watch``, ``/logs``). The server is the recipe's own uvicorn process; the
browser submits through the page's form, and a second job submitted from outside
must appear on the open page, without a reload, and reach its end there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import anyio
import httpx
import pytest

from .test_service_recipe import EXIT_BOUND_S, descendants, served, submit

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CHROMIUM = shutil.which("chromium")
# As this machine's notes ask of a headless Chromium here: no sandbox as root, and no
# background connections, which the closed network would refuse by the dozen.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 60_000


@pytest.fixture
def chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("ASUPERVISOR_BROWSER") == "skip":
            pytest.skip("ASUPERVISOR_BROWSER=skip: no Chromium (scripts/browser up installs it)")
        pytest.fail("no chromium on PATH: run `bash scripts/browser up` (scripts/test does)")
    return CHROMIUM


async def test_the_page_lists_jobs_and_follows_state_and_log_live(
    tmp_path: Path, state_dir: Path, chromium: str
) -> None:
    from playwright.async_api import async_playwright, expect

    async with (
        served(tmp_path) as (server, base),
        httpx.AsyncClient(base_url=base, timeout=60) as client,
        async_playwright() as playwright,
    ):
        browser = await playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            await page.goto(base + "/")

            # Submitted from the page: followed at once, state and log arrive live.
            await page.fill("#cmd", "echo one; sleep 1; echo two")
            await page.click("button[type=submit]")
            await expect(page.locator("#state")).to_have_text("SUCCEEDED", timeout=TIMEOUT_MS)
            await expect(page.locator("#log")).to_have_text("one\ntwo\n", timeout=TIMEOUT_MS)
            first = await page.text_content("#following")
            assert first is not None and first.startswith("local://recipe/job-")
            first_row = page.locator(f"tr[data-handle='{first}'] .state")
            await expect(first_row).to_have_text("SUCCEEDED", timeout=TIMEOUT_MS)

            # Submitted by someone else: the open page learns of it from /events alone.
            second = await submit(client, "sleep 1; echo three")
            second_row = page.locator(f"tr[data-handle='{second}'] .state")
            await expect(second_row).to_have_text("SUCCEEDED", timeout=TIMEOUT_MS)
            assert await page.text_content("#following") == first  # still following the first

            # Clicking a row follows that job: its log, replayed to its end.
            await page.click(f"tr[data-handle='{second}'] .handle")
            await expect(page.locator("#log")).to_have_text("three\n", timeout=TIMEOUT_MS)
            await expect(page.locator("#state")).to_have_text("SUCCEEDED", timeout=TIMEOUT_MS)

            # A fresh load lists both from GET /jobs, newest first.
            await page.reload()
            rows = page.locator("#jobs tr")
            await expect(rows).to_have_count(2, timeout=TIMEOUT_MS)
            assert [await r.get_attribute("data-handle") for r in await rows.all()] == [
                second,
                first,
            ]

            # The page's /events stream is open: SIGTERM must end it, and the server.
            server.terminate()
            with anyio.fail_after(EXIT_BOUND_S):
                await server.wait()
            assert not descendants(server.pid)
        finally:
            await browser.close()
