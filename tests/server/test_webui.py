"""The chat page at "/" in a real browser: Debian's chromium, headless, driven by selenium
through Debian's chromedriver (both installed by scripts/setup.sh).

anna-serve runs on the qwen3 fixture with --debug-step-delay-ms, so a reply takes a couple
of seconds and arrives in many SSE chunks: the test sees the assistant text grow in the page,
reloads, and finds the conversation again (localStorage). Also: the headers of the page
(strict CSP, nosniff, ETag / 304), --no-webui (then "/" is a 404), no request to another
origin, hostile model/user text rendered as text (no element injected), the stop button
cancelling the generation on the server, and the API-key field with --api-key.

Without chromium or chromedriver the test skips, saying why, unless CI is set (CI runs
scripts/setup.sh, which installs them): there a missing browser fails.
"""
import http.client
import os
import shutil
import time
import urllib.error
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from conftest import FIXTURES, ROOT, start_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _need_browser():
    if CHROMIUM and CHROMEDRIVER:
        return
    why = ("chromium/chromedriver not found on PATH (scripts/setup.sh installs Debian's 'chromium' and "
           "'chromium-driver'; ANNA_SKIP_APT=1 skipped that)")
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def web(fixture_model):
    s = start_server(fixture_model, "--parallel", "2", "--ctx-size", "512", "--max-completion-tokens", "40",
                     "--debug-step-delay-ms", "40", "--temperature", "1", "--seed", "7", "--debug-hooks")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    _need_browser()
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--no-first-run", "--disable-extensions", "--window-size=1200,900"):
        o.add_argument(a)
    # An explicit driver path: selenium's own driver manager would try to download one.
    d = webdriver.Chrome(options=o, service=Service(executable_path=CHROMEDRIVER))
    d.set_page_load_timeout(30)
    yield d
    d.quit()


def raw_get(url, path, headers=None, method="GET"):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request(method, path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), body


def wait(d, cond, timeout=30, msg=""):
    return WebDriverWait(d, timeout, poll_frequency=0.05).until(lambda _: cond(), message=msg)


def assistant_texts(d):
    return [e.text for e in d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")]


def idle(d):
    return not d.find_element(By.ID, "send").get_attribute("hidden")


def test_headers_and_assets(web):
    st, h, body = raw_get(web.url, "/")
    assert st == 200
    assert h["content-type"].startswith("text/html")
    csp = h["content-security-policy"]
    assert "default-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "frame-ancestors 'none'" in csp
    assert h["x-content-type-options"] == "nosniff"
    assert h["cache-control"] == "no-cache" and h["etag"].startswith('"')
    assert b'<script src="app.js"' in body
    # Self-contained: no URL of another host anywhere in the page's files.
    for path, ctype in (("/app.js", "text/javascript"), ("/app.css", "text/css")):
        st2, h2, b2 = raw_get(web.url, path)
        assert st2 == 200 and h2["content-type"].startswith(ctype), (path, st2, h2)
        assert h2["content-security-policy"] == csp
        assert b"http://" not in b2 and b"https://" not in b2 and b"//cdn" not in b2, path
    assert b"http://" not in body and b"https://" not in body
    # Revalidation: the same ETag gets a 304 with no body.
    st3, h3, b3 = raw_get(web.url, "/", {"If-None-Match": h["etag"]})
    assert st3 == 304 and b3 == b"" and h3["etag"] == h["etag"]
    assert raw_get(web.url, "/", {"If-None-Match": "*"})[0] == 304
    assert raw_get(web.url, "/", {"If-None-Match": '"0123"'})[0] == 200
    st4, _, b4 = raw_get(web.url, "/", method="HEAD")
    assert st4 == 200 and b4 == b""
    st5, h5, _ = raw_get(web.url, "/", method="POST")
    assert st5 == 405 and "GET" in h5["allow"]


def test_no_webui_is_404(fixture_model):
    s = start_server(fixture_model, "--no-webui", "--parallel", "1", "--ctx-size", "256")
    try:
        for path in ("/", "/app.js", "/index.html"):
            with pytest.raises(urllib.error.HTTPError) as ei:
                urllib.request.urlopen(s.url + path, timeout=30)
            assert ei.value.code == 404, path
            assert "content-security-policy" not in {k.lower() for k in ei.value.headers.keys()}
        assert s.get_json("/v1/models")["data"], "the API still answers"
    finally:
        s.stop()


def test_chat_streams_and_survives_reload(web, browser):
    d = browser
    d.get_log("browser")  # drop what came before
    d.get(web.url + "/")
    wait(d, lambda: d.find_element(By.ID, "model-name").text == "qwen3", msg="model name from /v1/models")
    assert d.find_elements(By.CSS_SELECTOR, "#conv-list li") == []
    # Record the assistant text's length at every DOM change, in the page itself: polling over
    # WebDriver could miss steps, the observer cannot.
    d.execute_script("""
      window.__lens = [];
      new MutationObserver(() => {
        const a = document.querySelectorAll('#messages .msg.assistant');
        if (a.length) window.__lens.push(a[a.length - 1].textContent.length);
      }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
    """)
    box = d.find_element(By.ID, "input")
    box.send_keys("Say hello in three words.")
    d.find_element(By.ID, "send").click()
    wait(d, lambda: not idle(d), 10, "the stop button shows while generating")
    wait(d, lambda: idle(d), 40, "the reply finishes")
    lens = d.execute_script("return window.__lens")
    grown = sorted(set(n for n in lens if n > 0))
    # 40 tokens at >= 40 ms a step: many chunks, each shown as it came.
    assert len(grown) >= 5, "assistant text did not grow in steps: %r" % lens
    assert lens[-1] == max(lens)
    texts = assistant_texts(d)
    assert len(texts) == 1 and texts[0].strip()
    user = d.find_element(By.CSS_SELECTOR, "#messages .msg.user .content").text
    assert user == "Say hello in three words."
    reply = d.find_element(By.CSS_SELECTOR, "#messages .msg.assistant").text
    status = d.find_element(By.ID, "status").text
    assert status.startswith("done"), status
    err = d.find_element(By.ID, "error")
    assert not err.is_displayed(), err.text
    titles = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conv-list .conv-title")]
    assert titles == ["Say hello in three words."]

    d.refresh()
    wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant"), 10, "history after reload")
    assert [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conv-list .conv-title")] == titles
    assert d.find_element(By.CSS_SELECTOR, "#messages .msg.user .content").text == user
    assert d.find_element(By.CSS_SELECTOR, "#messages .msg.assistant").text == reply

    # Only this server was contacted (no CDN, no font host).
    origins = d.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
        ".concat([location.origin])")
    assert set(origins) == {web.url}, origins
    # No console error: a CSP violation, a failed load (a favicon 404 included) or a script error
    # would show here.
    severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_new_switch_delete_and_escaping(web, browser):
    # Runs after test_chat_streams_and_survives_reload (file order): its conversation is the first.
    d = browser
    d.get(web.url + "/")
    wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#conv-list li"), 10)
    n0 = len(d.find_elements(By.CSS_SELECTOR, "#conv-list li"))
    d.find_element(By.ID, "new-chat").click()
    assert d.find_elements(By.CSS_SELECTOR, "#messages .msg") == []
    hostile = '<img src=x onerror="window.__pwned=1"> **bold** `code`'
    d.find_element(By.ID, "input").send_keys(hostile)
    d.find_element(By.ID, "send").click()
    wait(d, lambda: not idle(d), 10)
    wait(d, lambda: idle(d), 40)
    items = d.find_elements(By.CSS_SELECTOR, "#conv-list li")
    assert len(items) == n0 + 1
    msg = d.find_element(By.CSS_SELECTOR, "#messages .msg.user .content")
    # The markup arrives as text; only the markdown-ish bits became elements.
    assert msg.find_elements(By.TAG_NAME, "img") == []
    assert '<img src=x onerror="window.__pwned=1">' in msg.text
    assert msg.find_element(By.TAG_NAME, "strong").text == "bold"
    assert msg.find_element(By.TAG_NAME, "code").text == "code"
    assert d.execute_script("return window.__pwned === undefined")
    # Switch to the first conversation and back, then delete the new one.
    items[1].find_element(By.CLASS_NAME, "conv-title").click()
    assert d.find_element(By.CSS_SELECTOR, "#messages .msg.user .content").text == "Say hello in three words."
    items = d.find_elements(By.CSS_SELECTOR, "#conv-list li")
    items[0].find_element(By.CLASS_NAME, "conv-delete").click()
    assert len(d.find_elements(By.CSS_SELECTOR, "#conv-list li")) == n0
    d.refresh()
    wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#conv-list li"), 10)
    assert len(d.find_elements(By.CSS_SELECTOR, "#conv-list li")) == n0
    assert d.find_element(By.CSS_SELECTOR, "#messages .msg.user .content").text == "Say hello in three words."


def test_stop_cancels_on_the_server(fixture_model, browser):
    # greedy: with the server's default temperature the random fixture model sometimes ends the
    # second reply after a few tokens, before the reload that must cut it
    s = start_server(fixture_model, "--parallel", "1", "--ctx-size", "512", "--max-completion-tokens", "400",
                     "--debug-step-delay-ms", "40", "--temperature", "0")
    try:
        d = browser
        d.get(s.url + "/")
        d.execute_script("localStorage.clear()")
        d.refresh()
        wait(d, lambda: d.find_element(By.ID, "model-name").text == "qwen3", 10)
        d.find_element(By.ID, "input").send_keys("Count to one thousand.")
        d.find_element(By.ID, "send").click()
        wait(d, lambda: any(t.strip() for t in assistant_texts(d)), 20, "first tokens")
        assert s.health()["scheduler"]["running"] == 1
        d.find_element(By.ID, "stop").click()
        wait(d, lambda: idle(d), 10, "stopped")
        # The connection closed: the server cancels well before 400 tokens x 40 ms.
        s.wait_idle(timeout=5)
        assert d.find_element(By.ID, "status").text == "stopped"
        assert "(stopped)" in d.find_element(By.CSS_SELECTOR, "#messages .msg.assistant").text
        assert "client gone" in s.log() or '"client_gone":true' in s.log()
        # A reload mid-reply: the page had saved what came so far, shows it as cut, and the
        # server cancels this generation too.
        d.find_element(By.ID, "input").send_keys("Count again.")
        d.find_element(By.ID, "send").click()
        wait(d, lambda: len(assistant_texts(d)) == 2 and len(assistant_texts(d)[1]) > 20, 20)
        time.sleep(1.5)
        d.refresh()
        wait(d, lambda: len(assistant_texts(d)) == 2, 10)
        cut = d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")[1]
        assert cut.find_element(By.CLASS_NAME, "content").text.strip(), "partial reply saved"
        assert "(stopped)" in cut.text
        s.wait_idle(timeout=5)
    finally:
        s.stop()


def test_api_key_field(fixture_model, browser):
    s = start_server(fixture_model, "--parallel", "1", "--ctx-size", "256", "--max-completion-tokens", "8",
                     "--api-key", "sekret-key")
    try:
        d = browser
        d.get(s.url + "/")  # the page itself needs no key
        d.execute_script("localStorage.clear()")
        d.refresh()
        wait(d, lambda: d.find_element(By.ID, "key-box").is_displayed(), 10, "key field after a 401")
        assert d.find_element(By.ID, "model-name").text == "API key needed"
        k = d.find_element(By.ID, "api-key")
        k.send_keys("sekret-key")
        d.find_element(By.ID, "input").click()  # 'change' fires on blur
        wait(d, lambda: d.find_element(By.ID, "model-name").text == "qwen3", 10, "model after the key")
        d.find_element(By.ID, "input").send_keys("hi")
        d.find_element(By.ID, "send").click()
        wait(d, lambda: not idle(d) or assistant_texts(d), 10)
        wait(d, lambda: idle(d), 30)
        assert not d.find_element(By.CSS_SELECTOR, "#messages .msg.assistant").find_elements(By.CLASS_NAME, "msg-error")
        d.refresh()
        assert d.find_element(By.ID, "api-key").get_attribute("value") == "sekret-key"
        d.execute_script("localStorage.clear()")
    finally:
        s.stop()


FORCED = ('<think>\nThe user wants the weather.\n</think>\n\nChecking **now**. <tool_call>\n'
          '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def force_output(d, text, tools=None):
    """The page sends what a user types; the test adds the server's debug hook (a forced model
    output, --debug-hooks) and tools to each chat request by wrapping the page's fetch."""
    d.execute_script("""
      const force = arguments[0], tools = arguments[1], f = window.fetch;
      window.fetch = (u, o) => {
        if (String(u).includes('chat/completions')) {
          const b = JSON.parse(o.body);
          b.anna_debug_output = force;
          if (tools) b.tools = tools;
          o = Object.assign({}, o, {body: JSON.stringify(b)});
        }
        return f(u, o);
      };""", text, tools)


@pytest.mark.parametrize("fmt", ["none", "deepseek"])
def test_reasoning_folded_and_tool_calls_shown(fixture_model, browser, fmt):
    # none: <think> arrives in the content and the page folds it; deepseek: reasoning_content deltas.
    s = start_server(fixture_model, "--parallel", "1", "--ctx-size", "512", "--max-completion-tokens", "100",
                     "--debug-hooks", "--reasoning-format", fmt)
    try:
        d = browser
        d.get(s.url + "/")
        d.execute_script("localStorage.clear()")
        d.refresh()
        wait(d, lambda: d.find_element(By.ID, "model-name").text == "qwen3", 10)
        force_output(d, FORCED, TOOLS)
        d.find_element(By.ID, "input").send_keys("Weather in Paris?")
        d.find_element(By.ID, "send").click()
        wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant .tool-call"), 20, "tool call")
        wait(d, lambda: idle(d), 20)
        a = d.find_element(By.CSS_SELECTOR, "#messages .msg.assistant")
        det = a.find_element(By.CSS_SELECTOR, "details.reasoning")
        assert det.get_attribute("open") is None, "reasoning starts folded"
        body = a.find_element(By.CLASS_NAME, "reasoning-text")
        assert not body.is_displayed()
        assert body.get_attribute("textContent") == "The user wants the weather."
        det.find_element(By.TAG_NAME, "summary").click()
        assert body.is_displayed() and body.text == "The user wants the weather."
        content = a.find_element(By.CLASS_NAME, "content")
        assert "The user wants" not in content.get_attribute("textContent")
        assert "<think>" not in a.get_attribute("textContent")
        if fmt == "deepseek":
            # The server parsed the call: content and call arrive apart.
            assert content.text == "Checking now."
            assert content.find_element(By.TAG_NAME, "strong").text == "now"
            tc = a.find_element(By.CSS_SELECTOR, "details.tool-call")
            assert tc.find_element(By.TAG_NAME, "summary").text == "Tool call: get_weather"
            tc.find_element(By.TAG_NAME, "summary").click()
            assert '"city": "Paris"' in tc.find_element(By.TAG_NAME, "code").text
    finally:
        s.stop()


def png_file(path):
    import struct
    import zlib

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
    w, h = 4, 4
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                     chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return str(path)


def attach(d, path):
    f = d.find_element(By.ID, "file")
    d.execute_script("arguments[0].hidden = false", f)
    f.send_keys(path)
    d.execute_script("arguments[0].hidden = true", f)
    wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#previews img"), 10, "preview")


def test_image_refused_by_text_model(web, browser, tmp_path):
    d = browser
    d.get(web.url + "/")
    d.find_element(By.ID, "new-chat").click()
    attach(d, png_file(tmp_path / "red.png"))
    d.find_element(By.ID, "input").send_keys("What colour?")
    d.find_element(By.ID, "send").click()
    wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant .msg-error"), 20, "the 400 shown")
    err = d.find_element(By.CSS_SELECTOR, "#messages .msg.assistant .msg-error").text
    assert err.startswith("HTTP 400") and "does not accept images" in err, err
    assert not d.find_element(By.ID, "attach").is_displayed(), "attach hidden once the server said no"
    src = d.find_element(By.CSS_SELECTOR, "#messages .msg.user img").get_attribute("src")
    assert src.startswith("data:image/png;base64,")
    items = d.find_elements(By.CSS_SELECTOR, "#conv-list li")
    items[0].find_element(By.CLASS_NAME, "conv-delete").click()


def test_image_reaches_a_vision_model(browser):
    """The qwen3_5 vision e2e fixture (tests/server/test_vision.py): the page's image part gets
    the greedy reply transformers gave for the same image and question."""
    e2e = os.path.join(ROOT, "tests", "fixtures", "qwen3_5_vision", "e2e")
    import json
    import tempfile
    case = {c["name"]: c for c in json.load(open(os.path.join(e2e, "expected.json")))["cases"]}["one_image"]
    (text,) = [p["text"] for p in case["messages"][0]["content"] if p["type"] == "text"]
    with tempfile.TemporaryDirectory() as td:
        for f in ("config.json", "chat_template.jinja", "preprocessor_config.json"):
            os.symlink(os.path.join(e2e, f), os.path.join(td, f))
        for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            os.symlink(os.path.join(FIXTURES, "qwen3_5", f), os.path.join(td, f))
        s = start_server(td, "--parallel", "1", "--ctx-size", "512", "--temperature", "0",
                         "--max-completion-tokens", str(len(case["greedy_ids"])))
        try:
            d = browser
            d.get(s.url + "/")
            d.execute_script("localStorage.clear()")
            d.refresh()
            wait(d, lambda: d.find_element(By.ID, "model-name").text not in ("…", ""), 10)
            attach(d, os.path.join(e2e, case["images"][0]))
            d.find_element(By.ID, "input").send_keys(text)
            d.find_element(By.ID, "send").click()
            wait(d, lambda: not idle(d), 10)
            wait(d, lambda: idle(d), 60)
            a = d.find_element(By.CSS_SELECTOR, "#messages .msg.assistant")
            assert not a.find_elements(By.CLASS_NAME, "msg-error"), a.text
            got = a.find_element(By.CLASS_NAME, "content").get_attribute("textContent")
            assert got == case["greedy_text"].strip(), (got, case["greedy_text"])
            d.refresh()
            wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#messages .msg.user img"), 10, "image kept")
            d.execute_script("localStorage.clear()")
        finally:
            s.stop()
