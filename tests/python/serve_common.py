"""Shared by the tests that start `deepinfer serve` / `deepinfer router` processes: where the
repository and the bundled model are, python/deepinfer/serve.py loaded from the tree (no install
needed), and small HTTP / OpenAI-client helpers."""
import http.client
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "assets" / "default-model"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


serve = _load("deepinfer_serve", ROOT / "python" / "deepinfer" / "serve.py")


def get(port, path, timeout=30):
    """(status, body bytes) of GET http://127.0.0.1:port/path."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def client(port, timeout=120):
    import openai  # the callers importorskip it first
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=timeout)
