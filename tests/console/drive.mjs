// Drives Debian's Chromium (npm playwright-core, never a downloaded browser) through one
// scenario of the admin console and prints one JSON line with what it saw; the Python
// test (tests/python/test_console.py) owns the relay, the data and the assertions.
//
//   node tests/console/drive.mjs SCENARIO '{"base": "https://127.0.0.1:PORT", "token": ..., ...}'
//
// Scenarios: signin (a token; returns the error shown or the page reached), tail (opens the
// live tail of a topic, runs `publish` (a command line) and times the row's appearance),
// detail (opens an event's detail: its text, and whether any injected markup ran), act
// (opens a task's action dialog, confirms, returns the result line), reconnect (waits for
// the live indicator to go off and come back while the test restarts the relay, then
// reads the task table), shots (screenshots of every page at 1280x800 and 390x844, light
// and dark, into `dir`), from_time (a topic browsed from a time), browse (a topic from its
// start, a search by id, the search in the URL across a reload, a CSV export, the detail in
// sight; with no `topic`, only the topics the token lists), alarms (the Overview's alarms once
// one containing `expect` shows). The browser trusts the test's CA through --ignore-certificate-errors
// on 127.0.0.1 only (a test relay's development certificate).
import { createRequire } from "node:module";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(join(dirname(fileURLToPath(import.meta.url)), "..", "..", "console", "package.json"));
const { chromium } = require("playwright-core");

const [scenario, argText] = process.argv.slice(2);
const args = JSON.parse(argText || "{}");
const profile = mkdtempSync(join(tmpdir(), "diaspora-chromium-"));
const watchdog = setTimeout(() => {
  console.log(JSON.stringify({ error: "watchdog: the scenario took over 90 s" }));
  process.exit(3);
}, 90_000);

const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.DIASPORA_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  ignoreHTTPSErrors: true,
  viewport: { width: args.width || 1280, height: args.height || 800 },
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--disable-quic"],
});
const out = { requests_elsewhere: [], console_errors: [] };
try {
  const page = browser.pages()[0] || (await browser.newPage());
  page.on("request", (r) => {
    if (!r.url().startsWith(args.base) && !r.url().startsWith("data:")) out.requests_elsewhere.push(r.url());
  });
  page.on("console", (m) => m.type() === "error" && out.console_errors.push(m.text()));
  page.on("pageerror", (e) => out.console_errors.push(String(e)));

  async function signIn(tok = args.token) {
    await page.goto(`${args.base}/console/`);
    await page.fill("#token", tok);
    await page.click("button[type=submit]");
  }
  const go = async (hash) => {
    await page.evaluate((h) => (location.hash = h), hash);
    await page.waitForTimeout(300);
  };

  if (scenario === "signin") {
    await signIn();
    const shown = await Promise.race([
      page.waitForSelector("#signin-error", { timeout: 10_000 }).then(async (e) => ({ refused: await e.textContent() })),
      page.waitForSelector("header nav", { timeout: 10_000 }).then(() => ({ page: "signed-in" })),
    ]);
    Object.assign(out, shown);
  } else if (scenario === "tail") {
    await signIn();
    await go("#/topics");
    await page.click(`tr:has(td:text-is("${args.topic}")) button:text("Live tail")`);
    await page.waitForSelector(".tail small:has-text('; live')");
    const t0 = Date.now();
    const r = spawnSync(args.publish[0], args.publish.slice(1), { encoding: "utf8" });
    const published = Date.now();
    out.publish_status = r.status;
    out.publish_stderr = r.stderr;
    await page.waitForSelector(`tr.event-row:has-text("${args.expect}")`, { timeout: 10_000 });
    out.seen_after_publish_ms = Date.now() - published;
    out.publish_ms = published - t0;
  } else if (scenario === "detail") {
    await signIn();
    await go("#/topics");
    await page.click(`tr:has(td:text-is("${args.topic}")) button:text("Newest")`);
    const row = await page.waitForSelector(`tr.event-row:has-text("${args.expect}")`);
    await row.click();
    out.detail = await (await page.waitForSelector("#event-detail")).textContent();
    out.cells = await row.evaluate((r) => r.textContent);
    out.injected_ran = await page.evaluate(() => window.__xss === 1);
    out.img_elements = await page.evaluate(() => document.querySelectorAll("img").length);
  } else if (scenario === "act") {
    await signIn();
    await go(`#/tasks?workflow=${args.workflow}`);
    await page.click(`tr[data-task="${args.task}"] button[aria-label^="Act on"]`);
    await page.selectOption("dialog select[name=action]", args.action || "restart");
    if (args.target) await page.selectOption("dialog select[name=target]", args.target);
    await page.fill("dialog input[name=reason]", "console test");
    out.warning = (await page.$("#action-warning")) && (await page.textContent("#action-warning"));
    out.ended_banner = (await page.$("#run-ended")) && (await page.textContent("#run-ended"));
    out.ended_warning = (await page.$("#run-ended-warning")) && (await page.textContent("#run-ended-warning"));
    if (args.readers_warning) await page.waitForSelector("#readers-warning", { timeout: 10_000 });
    out.readers_warning = (await page.$("#readers-warning")) && (await page.textContent("#readers-warning"));
    await page.click("dialog button[type=submit]");
    out.result = await (await page.waitForSelector("#action-result")).textContent();
    if (args.wait_outcome) {
      await page.click("dialog button[type=button]");
      await go("#/actions");
      const cell = await page.waitForSelector(`tr:has-text("console test") .state:text-is("${args.wait_outcome}")`, { timeout: 20_000 });
      out.outcome = await cell.textContent();
      out.outcome_row = await page.evaluate(() => document.querySelector("table.actions tbody tr")?.textContent);
    }
  } else if (scenario === "drain") {
    await signIn();
    await go("#/sites");
    const card = `article.site[data-site="${args.site}"]`;
    await page.click(`${card} button.act:text("${args.undrain ? "Undrain…" : "Drain…"}")`);
    await page.fill("dialog input[name=reason]", "console test drain");
    await page.click("dialog button[type=submit]");
    out.result = await (await page.waitForSelector("#action-result")).textContent();
    await page.click("dialog button[type=button]");
    // The engine's acknowledgement reaches the views: the site is marked (or unmarked).
    await page.waitForSelector(`${card} .state.drained`, { state: args.undrain ? "detached" : "attached", timeout: 20_000 });
    out.drained = (await page.$(`${card} .state.drained`)) !== null;
  } else if (scenario === "evals") {
    await signIn();
    await go("#/training");
    await page.waitForSelector("table.evals tbody tr");
    out.headers = await page.$$eval("table.evals thead th", (e) => e.map((x) => x.textContent));
    out.rows = await page.$$eval("table.evals tbody tr", (r) => r.map((x) => [...x.cells].map((c) => c.textContent)));
  } else if (scenario === "from_time") {
    await signIn();
    await go("#/topics");
    await page.click(`tr:has(td:text-is("${args.topic}")) button:text("Newest")`);
    await page.waitForSelector("#scan-status");
    await page.selectOption("select[name=start]", "time");
    const d = new Date(args.time_ms);  // datetime-local takes the browser's local time
    const pad = (n) => String(n).padStart(2, "0");
    // Chromium writes a whole minute without its seconds ("05:37", not "05:37:00"), and
    // fill() refuses a value the input does not keep as given.
    const secs = d.getSeconds() ? `:${pad(d.getSeconds())}` : "";
    const local = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}${secs}`;
    await page.fill("input[name=from-time]", local);
    await page.click("form.browse button[type=submit]");
    await page.waitForSelector(".tail small:has-text('from ')");
    await page.waitForSelector(`tr.event-row:has-text("${args.expect}")`);
    out.offsets = await page.$$eval("tr.event-row td:first-child", (e) => e.map((x) => Number(x.textContent)));
  } else if (scenario === "timeline") {
    await signIn();
    await go(`#/tasks?workflow=${args.workflow}`);
    await page.waitForSelector(".timeline .lane");
    out.lanes = await page.$$eval(".timeline .lane:not(.axis) .lane-name", (e) => e.map((x) => x.textContent));
    out.ticks = await page.$$eval(".timeline .axis-track .tick", (e) => e.map((x) => x.textContent));
    out.faults = await page.$$eval(".timeline .mark.fault", (e) => e.map((x) => x.title));
    out.bars = await page.$$eval(".timeline .bar[title]", (e) => e.map((x) => x.getAttribute("title")));
    out.anomalies = await page.$$eval(".timeline .mark.anomaly", (e) => e.map((x) => x.getAttribute("title")));
    out.actions = await page.$$eval(".timeline .mark.action", (e) => e.map((x) => x.getAttribute("title")));
    out.incidents = await page.$$eval("table.incidents tbody tr", (r) => r.map((x) => ({
      id: x.dataset.incident, cells: [...x.querySelectorAll("td")].map((c) => c.textContent) })));
  } else if (scenario === "reconnect") {
    await signIn();
    await go(`#/tasks?workflow=${args.workflow}`);
    await page.waitForSelector(".live.on");
    out.before = await page.$$eval("table.tasks tbody tr", (r) => r.map((x) => x.dataset.task));
    console.log(JSON.stringify({ ready: true }));  // the test restarts the relay now
    await page.waitForSelector(".live.off", { timeout: 20_000 });
    out.banner = await page.textContent("#relay-down").catch(() => null);  // drawn with the indicator
    out.during = await page.$$eval("table.tasks tbody tr", (r) => r.map((x) => x.dataset.task));
    await page.waitForSelector(".live.on", { timeout: 30_000 });
    out.banner_after = await page.$("#relay-down").then((e) => !!e);
    await page.waitForSelector(`tr[data-task="${args.expect}"]`, { timeout: 20_000 });
    out.after = await page.$$eval("table.tasks tbody tr", (r) => r.map((x) => x.dataset.task));
  } else if (scenario === "shots") {
    await signIn();
    await page.waitForSelector("header nav");
    for (const [w, h] of [[1280, 800], [390, 844]]) {
      await page.setViewportSize({ width: w, height: h });
      for (const theme of ["light", "dark"]) {
        await page.evaluate((t) => localStorage.setItem("diaspora.console.theme", t), theme);
        await page.reload();
        await page.waitForSelector("header nav");
        for (const p of ["overview", "topics", "tasks", "sites", "actions", "consumers", "training"]) {
          await go(`#/${p}${(p === "tasks" || p === "sites") && args.workflow ? "?workflow=" + args.workflow : ""}`);
          await page.waitForTimeout(700);
          await page.screenshot({ path: join(args.dir, `${p}-${w}-${theme}.png`), fullPage: false });
        }
        if (args.workflow) {  // a browse with an event's detail open, and a task's detail
          await go(`#/topics?topic=${args.workflow}.events&start=earliest&type=action`);
          await page.waitForSelector("#scan-status");
          await page.click("tr.event-row");
          await page.waitForTimeout(300);
          await page.screenshot({ path: join(args.dir, `topics-browse-${w}-${theme}.png`), fullPage: false });
          await go(`#/overview`);
          await go(`#/tasks?workflow=${args.workflow}&task=burn.0`);
          await page.waitForSelector(".task-detail");
          await page.waitForTimeout(300);
          await page.screenshot({ path: join(args.dir, `task-detail-${w}-${theme}.png`), fullPage: false });
        }
      }
    }
    out.shots = true;
    // Keyboard: every link and button is reachable with Tab.
    const stops = [];
    for (let i = 0; i < 20; i++) {
      await page.keyboard.press("Tab");
      stops.push(await page.evaluate(() => document.activeElement?.textContent?.trim() || document.activeElement?.tagName));
    }
    out.tab_stops = stops;
  } else if (scenario === "reset") {
    // An admin resets a consumer group from the Consumers page.
    await signIn();
    await page.waitForSelector("header nav");
    await go("#/consumers");
    await page.click(`tr[data-group="${args.group}/${args.topic}"] button`);
    await page.selectOption("dialog select[name=reset-to]", "offset");
    await page.fill("dialog input[name=reset-offset]", String(args.offset));
    await page.click("dialog button[type=submit]");
    out.result = await (await page.waitForSelector("#reset-result")).textContent();
  } else if (scenario === "links") {
    // The Consumers page's connections the relay said congested, once `expect` is one of them.
    await signIn();
    await page.waitForSelector("header nav");
    await go("#/consumers");
    await page.waitForSelector(`tr[data-link="${args.expect}"]`, { timeout: 20_000 });
    out.rows = await page.$$eval("#links tbody tr", (r) => r.map((x) => [...x.querySelectorAll("td")].map((td) => td.textContent.trim())));
  } else if (scenario === "alarms") {
    // The Overview's alarms, once one containing `expect` is shown.
    await signIn();
    await page.waitForSelector("header nav");
    await go("#/overview");
    await page.waitForFunction((t) => [...document.querySelectorAll("ul.alarms li")].some((li) => li.textContent.includes(t)),
                               args.expect, { timeout: 20_000 });
    out.alarms = await page.$$eval("ul.alarms li", (l) => l.map((x) => x.textContent));
  } else if (scenario === "sites") {
    await signIn();
    await page.waitForSelector("header nav");
    await go(`#/sites?workflow=${args.workflow}`);
    await page.waitForSelector("h3 span.state");
    out.badges = await page.$$eval("h3 span.state", (b) => b.map((x) => ({ text: x.textContent, title: x.title, heading: x.parentElement.textContent })));
    out.gaps = await page.$$eval("article.site", (a) => a.map((x) => ({ site: x.dataset.site, gaps: Number(x.querySelector(".chart")?.dataset.gaps ?? -1),
                                                                      note: x.querySelector(".chart + p.explain")?.textContent ?? null })));
  } else if (scenario === "task") {
    // A task's detail panel, opened from the list, then again from its URL.
    await signIn();
    await page.waitForSelector("header nav");
    await go(`#/tasks?workflow=${args.workflow}`);
    await page.click(`tr[data-task="${args.task}"] button[aria-label^="Details of"]`);
    const read = async () => {
      const panel = await page.waitForSelector(".task-detail");
      return {
        attempts: await panel.$$eval("table.attempts tbody tr", (rs) => rs.map((r) => [...r.children].map((c) => c.textContent))),
        incident: await panel.$$eval("ul.incident li", (ls) => ls.map((l) => l.textContent.replace(/\s+/g, " ").trim())),
        events_link: await panel.$eval("a", (a) => a.getAttribute("href")),
        focused: await page.evaluate(() => document.activeElement?.classList.contains("task-detail")),
      };
    };
    out.from_list = await read();
    out.url = await page.evaluate(() => location.hash);
    await page.reload();
    out.from_url = await read();
    await page.click(".task-detail a");
    await page.waitForSelector("#scan-status");
    out.events_offsets = await page.$$eval("tr.event-row td:first-child", (e) => e.map((x) => Number(x.textContent)));
  } else if (scenario === "browse") {
    // A topic from its start, a search by id over the whole topic, the search kept in the
    // URL across a reload, an export, the detail in sight, and what the token saw refused.
    out.refused = [];
    page.on("response", (r) => r.status() >= 400 && out.refused.push(`${r.status()} ${new URL(r.url()).pathname}`));
    await signIn();
    await page.waitForSelector("header nav");
    await go("#/topics");
    out.topics = await page.$$eval("section table:first-of-type tbody tr td:first-child", (e) => e.map((x) => x.textContent));
    if (args.topic) {
      const rowsNow = () => page.$$eval("tr.event-row td:first-child", (e) => e.map((x) => Number(x.textContent)));
      const status = async (was) => {
        await page.waitForFunction((w) => (document.querySelector("#scan-status")?.textContent || "") !== w, was || "");
        return page.textContent("#scan-status");
      };
      await page.click(`tr:has(td:text-is("${args.topic}")) button:text("From the start")`);
      out.start_status = await status();
      out.start_offsets = await rowsNow();
      await page.click("#scan-status button:text('Newer')");
      out.newer_status = await status(out.start_status);
      out.newer_first = (await rowsNow())[0];
      await page.fill("input[name=filter-id]", args.id);
      await page.selectOption("select[name=start]", "newest");
      await page.click("form.browse button[type=submit]");
      out.search_status = await status(out.newer_status);
      out.search_offsets = await rowsNow();
      out.url = await page.evaluate(() => location.hash);
      await page.reload();
      out.reload_status = await status();
      out.reload_offsets = await rowsNow();
      const [download] = await Promise.all([page.waitForEvent("download"), page.click("#scan-status button:text('Export CSV')")]);
      out.download_name = download.suggestedFilename();
      out.download_text = readFileSync(await download.path(), "utf8");
      await page.click("tr.event-row");
      const box = await (await page.waitForSelector(".detail")).boundingBox();
      out.detail_in_view = box.y >= 0 && box.y + 40 < 800;
      if (args.republish_to) {
        await page.click(".detail button:text('Publish again…')");
        await page.fill("input[name=republish-to]", args.republish_to);
        await page.click(".detail form.republish button[type=submit]");
        out.republish = await (await page.waitForSelector("#republish-result")).textContent();
      }
    }
  } else {
    out.error = `unknown scenario ${scenario}`;
  }
} catch (e) {
  out.error = String(e.stack || e);
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
  clearTimeout(watchdog);
}
console.log(JSON.stringify(out));
