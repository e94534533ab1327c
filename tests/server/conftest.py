"""Fixtures for the server suite: real `kiln serve` processes on free ports.

The kiln binary is $KILN (default build/kiln). The model is the
qwen3-dense-tiny fixture (random weights, the real Qwen3 tokenizer and chat
template); the tokenizer comes from the fixture itself.

Servers run with -t 1: the tests run on small shared machines where
OpenMP barriers across busy cores cost more than they give.
"""
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "kiln"))
MODEL = os.path.join(ROOT, "tests", "fixtures", "qwen3-dense-tiny")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `kiln serve` process."""

    def __init__(self, *extra, env=None):
        if not os.path.exists(KILN):
            pytest.skip(f"{KILN} not built")
        tok = MODEL  # the fixture carries the real Qwen3 tokenizer
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [KILN, "serve", "-m", MODEL, "--tokenizer", tok, "--port", str(self.port), "-t", "1", *extra]
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln serve exited with {self.proc.returncode}: {self.read_log()}")
            try:
                with urllib.request.urlopen(self.url + "/metrics", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("kiln serve did not come up: " + self.read_log())

    @property
    def pid(self):
        return self.proc.pid

    def read_log(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def metrics(self):
        """GET /metrics as {name or name{labels}: float}."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^(\S+)\s+(\S+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def rss_kib(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def srv():
    """The main server: default limits, no API key."""
    s = Server("--max-total-tokens", "8192")
    yield s
    assert s.alive(), "the server died during the suite: " + s.read_log()
    s.stop()
    assert s.proc.returncode == 0, "kiln serve did not shut down cleanly"


@pytest.fixture(scope="session")
def client(srv):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model(client):
    return client.models.list().data[0].id
