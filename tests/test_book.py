"""`make book` builds the handbook's website, and it works in a real browser: headless Chromium
(Debian's chromium and chromium-driver, driven by selenium) visits every page over
`python -m http.server` and checks links, images, plots, outputs, tables, math and search.
A screenshot of each page lands in _build/book_screenshots/ for a person to look at.

The build reuses the chapters that tests/test_chapters.py executed earlier in the session
(conftest.py runs this module last); a chapter without a fresh run is executed by the build.
Where root can make a network namespace, the build runs in one with loopback only: a theme or
extension that downloads anything fails there, and a warning fails the build."""

import base64
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import nbformat
import pytest

from test_chapter_rules import GLOSSARY_TERMS
from test_chapters import PLOTS

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "book"
PAGES_SOURCE = ROOT / "_build" / "book_src"
SHOTS = ROOT / "_build" / "book_screenshots"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
BUILD_TIMEOUT_S = 1500  # room for ten chapters executed by the build when no test ran them first
PAGE_TIMEOUT_S = 60  # one page's load, its images and the search's results
SHOT_MAX_HEIGHT = 16000  # px: Chromium's limit for one screenshot
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--window-size=1280,900")
TABLE_RULE = re.compile(r"^\|[-:| ]+\|\s*$", re.M)  # the |---|---| line of a markdown table

pytestmark = [
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                       reason="no headless browser: `make book-deps` installs Debian's chromium "
                              "and chromium-driver (apt-get, as root)"),
    pytest.mark.timeout(BUILD_TIMEOUT_S + 300),  # the build runs in the first test's setup
]

# What the browser reports about a page, in one call.
PAGE_FACTS = """
const cells = [...document.querySelectorAll('div.cell')].map(c => {
  const out = c.querySelector('.cell_output');
  return {output: out ? out.innerText.trim().length : 0,
          folded_output: out && out.closest('details') ? out.textContent.trim().length : 0,
          images: out ? [...out.querySelectorAll('img')].filter(i => i.naturalWidth > 0).length : 0};
});
const box = e => e.getBoundingClientRect();
return {
  images: [...document.images].map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0})),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  cells: cells,
  tables: [...document.querySelectorAll('table')].filter(t => box(t).width > 0 && t.rows.length > 1).length,
  math: [...document.querySelectorAll('math')].map(m => box(m).width > 0 && box(m).height > 0),
  resources: performance.getEntriesByType('resource').map(r => r.name),
  height: document.documentElement.scrollHeight,
};
"""


def offline() -> list[str]:
    """A command prefix that runs in a new network namespace with only loopback up (root with
    unshare and ip), proving the build fetches nothing; [] where that cannot be had."""
    prefix = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "offline"]
    if not (shutil.which("unshare") and shutil.which("ip")):
        return []
    probe = subprocess.run(prefix + ["true"], capture_output=True, timeout=PAGE_TIMEOUT_S)
    return prefix if probe.returncode == 0 else []


@pytest.fixture(scope="module")
def site() -> Path:
    prefix = offline()
    done = subprocess.run(prefix + [sys.executable, "book/build.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    where = "with no network (a namespace with loopback only)" if prefix else "(network not cut)"
    assert done.returncode == 0, f"make book failed {where}:\n{done.stdout}\n{done.stderr}"
    assert "python -m http.server -d _build/book" in done.stdout, done.stdout
    return SITE


def serve(directory: Path) -> tuple[subprocess.Popen, str]:
    """`python -m http.server` on a free port, as the build tells a reader to open the book."""
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind",
                               "127.0.0.1", "-d", str(directory)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (http://...) ..."
    port = re.search(r"port (\d+)", line)
    if not port:
        server.kill()
        server.wait()
        pytest.fail(f"http.server did not start: {line!r}")
    return server, f"http://127.0.0.1:{port[1]}/"


def chromium(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + (f"--user-data-dir={profile}",):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(PAGE_TIMEOUT_S)
    return driver


@pytest.fixture
def browser():
    """A fresh Chromium with its own profile; quit and its profile removed afterwards."""
    profile = tempfile.mkdtemp(prefix="chromium-")
    driver = chromium(profile)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def page_names(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob("*.html")
                  if p.parts[len(site.parts)] not in ("_static", "_sources"))


def screenshot(driver, name: str, height: int) -> None:
    """The whole page (up to Chromium's limit) as one PNG, drawn in a viewport that tall."""
    metrics = {"width": 1280, "height": min(height, SHOT_MAX_HEIGHT), "deviceScaleFactor": 1,
               "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    target = SHOTS / (name.replace("/", "__").removesuffix(".html") + ".png")
    target.write_bytes(base64.b64decode(shot["data"]))


def notebook_cells(name: str) -> list | None:
    """The code cells of the chapter a page shows, as the book's source holds them."""
    source = PAGES_SOURCE / Path(name).with_suffix(".ipynb")
    if not source.exists():
        return None
    return [c for c in nbformat.read(source, 4).cells if c.cell_type == "code"]


@pytest.fixture(scope="module")
def base_url(site):
    server, url = serve(site)
    yield url
    server.terminate()
    server.wait()
    server.stdout.close()


def load(driver, url: str) -> dict:
    """Open a page, wait until every image has loaded or failed, and return PAGE_FACTS."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && [...document.images].every(i => i.complete)"))
    return driver.execute_script(PAGE_FACTS)


FOLDED_OUTPUT = {"hide-output", "hide-cell"}  # the output sits in a closed toggle on the page


def cell_problems(name: str, facts: dict) -> list[str]:
    """Chapter pages: a code cell with outputs shows them (a folded one, behind its toggle); a
    plotting cell shows its image."""
    cells = notebook_cells(name)
    if cells is None:
        return []
    shown = facts["cells"]
    if len(shown) != len(cells):
        return [f"{name}: {len(cells)} code cells in the notebook, {len(shown)} on the page"]
    problems = []
    for i, (cell, dom) in enumerate(zip(cells, shown)):
        first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
        folded = FOLDED_OUTPUT & set(cell.metadata.get("tags", []))
        if cell.get("outputs") and folded and not dom["folded_output"]:
            problems.append(f"{name}: code cell {i} ({first!r}), tagged {sorted(folded)}, has "
                            "no outputs behind a toggle")
        elif cell.get("outputs") and not folded and not (dom["output"] or dom["images"]):
            problems.append(f"{name}: code cell {i} ({first!r}) shows none of its outputs")
        if PLOTS.search(cell.source) and not dom["images"]:
            problems.append(f"{name}: plotting cell {i} ({first!r}) shows no image")
    return problems


def markdown_tables(name: str) -> int:
    source = PAGES_SOURCE / Path(name).with_suffix(".ipynb")
    if source.exists():
        text = "\n".join(c.source for c in nbformat.read(source, 4).cells if c.cell_type == "markdown")
    elif (md := PAGES_SOURCE / Path(name).with_suffix(".md")).exists():
        text = md.read_text()
    else:
        return 0
    return len(TABLE_RULE.findall(text))


def page_problems(name: str, facts: dict, origin: str) -> list[str]:
    problems = [f"{name}: image did not load: {i['src']}" for i in facts["images"] if not i["ok"]]
    problems += [f"{name}: fetched from outside the site: {r}" for r in facts["resources"]
                 if not r.startswith(origin)]
    if facts["tables"] < (want := markdown_tables(name)):
        problems.append(f"{name}: {want} markdown tables, {facts['tables']} rendered")
    if not all(facts["math"]):
        problems.append(f"{name}: {facts['math'].count(False)} formulas drawn with no size")
    return problems + cell_problems(name, facts)


def link_problems(seen: dict[str, set[str]], links: dict[str, set[str]], origin: str) -> list[str]:
    """Every link inside the site reaches a page (or file) and, with a #fragment, an id on it."""
    problems, fetched = [], {}
    for name, hrefs in links.items():
        for href in sorted(h for h in hrefs if h.startswith(origin)):
            url, fragment = urldefrag(href)
            path = urlparse(url).path.lstrip("/") or "index.html"
            if path.endswith("/"):
                path += "index.html"
            if path in seen:
                if fragment and fragment not in seen[path]:
                    problems.append(f"{name}: link to a missing anchor: {href}")
                continue
            if url not in fetched:
                try:
                    with urllib.request.urlopen(url, timeout=PAGE_TIMEOUT_S) as answer:
                        fetched[url] = answer.status
                except OSError as exc:
                    fetched[url] = exc
            if fetched[url] != 200:
                problems.append(f"{name}: broken link {href}: {fetched[url]}")
    return problems


def test_every_page_renders(site, base_url, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    names = page_names(site)
    assert "index.html" in names and any(n.startswith("chapters/") for n in names), names
    seen, links, problems = {}, {}, []
    for name in names:
        facts = load(browser, base_url + name)
        seen[name], links[name] = set(facts["ids"]), set(facts["links"])
        problems += page_problems(name, facts, base_url)
        screenshot(browser, name, facts["height"])
    problems += link_problems(seen, links, base_url)
    assert not problems, f"{len(problems)} problems on {len(names)} pages:\n" + "\n".join(problems)


def test_glossary_is_a_page_with_every_term(site):
    """The glossary is in the book, linked from the front page, with an anchor per term (which
    the chapters' glossary.md#term links land on) and the engine step's figure."""
    page = site / "chapters" / "glossary.html"
    assert page.exists(), "the book has no chapters/glossary.html: book/build.py lays it out"
    text = page.read_text()
    missing = sorted(set(GLOSSARY_TERMS) - set(re.findall(r'id="([^"]+)"', text)))
    assert not missing, f"chapters/glossary.html has no anchor for {missing}"
    assert "00_engine_step.png" in text, "the glossary page does not show 00_engine_step.png"
    assert 'href="chapters/glossary.html"' in (site / "index.html").read_text(), (
        "the front page does not link the glossary (README's reading order should)")


def test_search_finds_engine_core_dead(base_url, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(base_url + "search.html?q=ENGINE_CORE_DEAD")
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda d: d.execute_script(
        "const s = document.querySelector('#search-results .search-summary, p.search-summary');"
        "return s && s.innerText.trim().length > 0"))
    hits = browser.execute_script(
        "return [...document.querySelectorAll('#search-results li a')].map(a => a.href)")
    screenshot(browser, "search_ENGINE_CORE_DEAD", 900)
    assert any("/chapters/" in h for h in hits), f"searching ENGINE_CORE_DEAD found {hits}"


def test_math_renders_offline(browser, tmp_path):
    """No chapter has a formula yet: a page that has them, built with the book's settings, shows
    them as MathML that the browser draws, with no script from elsewhere."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "index.md").write_text(
        "# Math\n\nInline $t = n \\cdot s / B$ and a display:\n\n$$\\frac{a}{b} = \\sum_i x_i^2$$\n")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", "-c",
                           str(ROOT / "book"), str(tmp_path / "src"), str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    facts = load(browser, (tmp_path / "site" / "index.html").as_uri())
    assert facts["math"] == [True, True], f"formulas drawn with a size: {facts['math']}"
    text = browser.execute_script("return document.querySelector('article').innerText")
    assert "$" not in text and "\\frac" not in text, f"raw TeX on the page: {text!r}"
    outside = [r for r in facts["resources"] if not r.startswith("file://")]
    assert not outside, f"the page fetched {outside}"
