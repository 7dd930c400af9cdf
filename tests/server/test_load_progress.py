"""Model-load progress on stderr (anna_model_options.progress through cli_load_progress):
a bar redrawn in place when stderr is a terminal, one summary line otherwise."""
import os
import pty
import re
import select
import signal
import subprocess
import time

from conftest import FIXTURES, server_bin, start_server

QWEN3 = os.path.join(FIXTURES, "qwen3")
WEIGHTS_MIB = os.path.getsize(os.path.join(QWEN3, "model.safetensors")) / 2**20


def test_summary_line_when_not_a_terminal():
    s = start_server(QWEN3, "--parallel", "1", "--ctx-size", "256")
    try:
        log = s.log()
    finally:
        s.stop()
    m = re.search(r" info  read ([0-9.]+) MiB of weights in [0-9.]+ s \([0-9]+ MiB/s\)\n", log)
    assert m, log
    assert abs(float(m.group(1)) - WEIGHTS_MIB) < 0.06, (m.group(0), WEIGHTS_MIB)
    assert "\r" not in log and "loading weights [" not in log, log


def test_bar_on_a_terminal():
    master, slave = pty.openpty()
    p = subprocess.Popen([server_bin(), "--model-dir", QWEN3, "--port", "0", "--threads", "2", "--parallel", "1",
                          "--ctx-size", "256"], stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    try:
        deadline = time.time() + 60
        while b"listening on" not in out and time.time() < deadline and p.poll() is None:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
        os.close(master)
    text = out.decode(errors="replace")
    assert "\r[anna] loading weights [" in text, text
    assert re.search(r"\[#{30}\] 100%\s+[0-9.]+ / [0-9.]+ MiB", text), text
    assert "of weights in" not in text, text  # the bar replaces the summary line
