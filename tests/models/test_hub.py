"""Models by Hugging Face Hub id: a cache directory the tests fill themselves; the only address ever asked is a
closed port on 127.0.0.1, so nothing reaches the network."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.errors import KvbenchError
from kvbench.models.hub import cache_dir, looks_like_hub_id
from kvbench.models.resolve import resolve_model

PUBLISHED = Path(__file__).parent / "data" / "published"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_cache(cache: Path, repo_id: str, config: dict) -> Path:
    """The layout huggingface_hub writes: refs/main names a commit, snapshots/<commit>/ holds the files."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    return snapshot / "config.json"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when the block ends: a connection is refused at once


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


def llama_8b() -> dict:
    return json.loads((PUBLISHED / "llama-3.1-8b-instruct.json").read_text())


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", True),
        ("openai/gpt-oss-120b", True),
        ("Qwen/Qwen3-235B-A22B", True),
        ("gpt-5", False),
        ("./models/x", False),
        ("/abs/path", False),
        ("a/b/c", False),
        ("models/x.gguf", False),
        ("dir/config.json", False),
        ("~/model", False),
        ("../up", False),
        ("owner/..", False),
    ],
)
def test_what_reads_as_a_hub_id(spec, expected):
    assert looks_like_hub_id(spec) is expected


def test_cache_dir_follows_the_environment_at_each_call(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"


def test_offline_reads_the_local_cache(hub_cache, monkeypatch):
    fill_cache(hub_cache, "meta-llama/Llama-3.1-8B-Instruct", llama_8b())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shape = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    assert shape.name == "meta-llama/Llama-3.1-8B-Instruct"  # the id, not the snapshot's commit folder
    assert shape.bytes_per_token == 2 * 32 * 8 * 128 * 2 and shape.dtype == "bf16"
    assert shape.num_parameters == 8_030_261_248


def test_an_unreachable_hub_falls_back_to_the_cache(hub_cache):
    fill_cache(hub_cache, "meta-llama/Llama-3.1-8B-Instruct", llama_8b())
    assert resolve_model("meta-llama/Llama-3.1-8B-Instruct").num_layers == 32


def test_offline_and_not_cached_is_one_line(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(KvbenchError) as caught:
        resolve_model("acme/missing")
    message = str(caught.value)
    assert "\n" not in message and "HF_HUB_OFFLINE=1" in message and str(hub_cache) in message


def test_unreachable_and_not_cached_is_one_line(hub_cache):
    with pytest.raises(KvbenchError) as caught:
        resolve_model("acme/missing")
    message = str(caught.value)
    assert "\n" not in message and "cannot be reached" in message and str(hub_cache) in message


def test_the_command_takes_a_hub_id(hub_cache, monkeypatch, capsys):
    fill_cache(hub_cache, "openai/gpt-oss-120b", json.loads((PUBLISHED / "gpt-oss-120b.json").read_text()))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["capacity", "--model", "openai/gpt-oss-120b", "--gpu", "h100-80g", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"]["name"] == "openai/gpt-oss-120b" and result["fits"]
    code = main(["capacity", "--model", "openai/gpt-oss-20b"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: openai/gpt-oss-20b: config.json is not in") and err.count("\n") == 1


def test_a_run_refuses_a_hub_id_before_asking_the_hub(hub_cache):
    from kvbench.studies.local_model import load_model

    with pytest.raises(KvbenchError, match="a run needs the checkpoint's files on disk"):
        load_model("acme/missing")


GOOD_CONFIG = json.dumps(llama_8b()).encode()


class _HostileHub(http.server.BaseHTTPRequestHandler):
    """A Hub on 127.0.0.1 answering config.json as ``answer`` says: well, or with a path in its commit or ETag,
    or a redirect off the Hub."""

    answer = "ok"

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._reply(with_body=False)

    def do_GET(self) -> None:
        self._reply(with_body=True)

    def _reply(self, with_body: bool) -> None:
        redirect = {"file": "file:///etc/passwd", "host": "http://127.0.0.2:9/x/config.json"}.get(self.answer)
        if redirect:
            self.send_response(302)
            self.send_header("Location", redirect)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        etag = "../../../../escaped-etag" if self.answer == "etag" else "a" * 40
        commit = "../../../../escaped-commit" if self.answer == "commit" else COMMIT
        self.send_response(200)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Length", str(len(GOOD_CONFIG)))
        self.end_headers()
        if with_body:
            self.wfile.write(GOOD_CONFIG)


@pytest.mark.parametrize(
    "answer, said",
    [
        ("etag", "answered config.json with an ETag that is not a hash"),
        ("commit", "answered config.json with a commit that is not a hash"),
        ("file", "redirected config.json to a file: address"),
        ("host", "redirected config.json to another host (127.0.0.2)"),
    ],
)
def test_a_hostile_hub_answer_is_refused_before_anything_is_stored(answer, said, hub_cache, monkeypatch, tmp_path):
    handler = type("Hub", (_HostileHub,), {"answer": answer})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(KvbenchError) as raised:
            resolve_model("someone/model-x")
        assert said in str(raised.value) and "check HF_ENDPOINT" in str(raised.value)
        # nothing written outside the cache: the paths those answers name lead four levels up, out of it
        assert not list(tmp_path.parent.glob("escaped-*"))
        stored = [p for p in hub_cache.rglob("*") if p.is_file() and p.name != "CACHEDIR.TAG"]
        assert not [p for p in stored if "config" in p.name or "escaped" in str(p)]
        handler.answer = "ok"  # the same Hub answering well is read
        assert resolve_model("someone/model-x").num_layers == llama_8b()["num_hidden_layers"]
    finally:
        server.shutdown()
