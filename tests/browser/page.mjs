// Drives memprof's HTML page in Debian's chromium, as a user would:
//   node page.mjs PAGE.html SHOTS_DIR [FUNCTION]
// loads it, switches to the allocated view, searches FUNCTION, clicks
// into its frame, switches to calls, drags a range on the timeline, and
// prints what the page showed at each step as one JSON object. PNG
// screenshots of each step go to SHOTS_DIR.
import { chromium } from "playwright-core";
import { pathToFileURL } from "node:url";

const [page_file, shots, fn = "parse_request"] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"],
});
const result = { errors: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on("pageerror", (e) => result.errors.push(String(e)));
  page.on("console", (m) => m.type() === "error" && result.errors.push(m.text()));
  // Anything but the file itself is a request the page must not make.
  page.on("request", (r) => { if (!r.url().startsWith("file:")) result.errors.push("request " + r.url()); });
  const started = Date.now();
  await page.goto(pathToFileURL(page_file).href);
  await page.waitForFunction(() => window.memprof && window.memprof.ready, null, { timeout: 60000 });
  result.load_ms = Date.now() - started;
  const state = () => page.evaluate(() => ({ ...window.memprof.state, search: String(window.memprof.state.search), focus: window.memprof.focusName }));
  const text = (id) => page.evaluate((id) => document.getElementById(id).textContent, id);
  result.loaded = {
    ...(await state()),
    title: await page.title(),
    summary: await text("summary"),
    settings: await text("settings"),
    lost: await text("lost"),
  };
  await page.screenshot({ path: shots + "/1-loaded.png", fullPage: true });

  const allocated = page.locator("#views button", { hasText: "Allocated" });
  if (await allocated.count()) await allocated.click();
  await page.fill("#search", "^" + fn + "$");
  result.searched = { ...(await state()), matched: await text("matched") };
  await page.screenshot({ path: shots + "/2-searched.png", fullPage: true });

  const at = await page.evaluate((fn) => window.memprof.rectOf(fn), fn);
  if (at) await page.mouse.click(at.x, at.y);
  result.zoomed = { ...(await state()), label: await text("flame-label") };
  await page.screenshot({ path: shots + "/3-zoomed.png", fullPage: true });

  await page.click("#views button >> text=Calls");
  result.calls = { ...(await state()), label: await text("flame-label") };
  await page.click("#reset");

  const box = await page.locator("#timeline").boundingBox();
  if (box) {
    await page.mouse.move(box.x + box.width * 0.2, box.y + box.height / 2);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.8, box.y + box.height / 2, { steps: 5 });
    await page.mouse.up();
  }
  result.range = {
    ...(await state()),
    label: await text("selection-label"),
    header: await page.evaluate(() => [...document.querySelectorAll("#sites th")].map((t) => t.textContent)),
  };
  await page.screenshot({ path: shots + "/4-range.png", fullPage: true });

  await page.click("#sites th >> text=Calls");
  result.sorted = await page.evaluate(() => [...document.querySelectorAll("#sites tbody tr")].slice(0, 3).map((r) => r.cells[0].textContent));
} catch (e) {
  result.errors.push(String(e));
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
