"""Hub model ids through the real huggingface_hub client, against a stand-in Hub on 127.0.0.1.

The stand-in serves the endpoints huggingface_hub 1.33's snapshot_download calls, with the headers it requires:

    GET  /api/models/ORG/NAME/revision/REV     repo info: {"id", "sha", "siblings"}    (repo_info: REV -> commit)
    GET  /api/models/ORG/NAME/tree/SHA?recursive=True   [{"type": "file", "path", "size", "oid", "lfs"?}]
    HEAD /ORG/NAME/resolve/SHA/FILE            200 with X-Repo-Commit, ETag (git blob id), Content-Length; an LFS
                                               file (weights): 302 to a "CDN" host (localhost, not 127.0.0.1: the
                                               client only follows redirects on the Hub's own host) with
                                               X-Linked-Etag (sha256), X-Linked-Size, Location
    GET  same, or the CDN Location             the bytes
    404 X-Error-Code: RepoNotFound / RevisionNotFound / EntryNotFound; 401 (403 with a wrong token) GatedRepo

huggingface_hub reads HF_ENDPOINT, HF_HUB_OFFLINE and the cache folders once, at import, so each download runs in
a subprocess with its own environment: what `accel` run from a shell would do.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from accel.hub.hf_hub import is_hub_id
from tests.conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
KNOWN = ["gemma3-270m", "smollm2-135m"]
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")  # stored in LFS on the Hub: served through the CDN redirect
TOKEN = "hf_test_token"
DECOYS = {  # what a real repo has beside the HF folder; none of it may be downloaded
    "pytorch_model.bin": b"decoy: pickled torch weights",
    "tiny-Q4_0.gguf": b"GGUF decoy",
    "onnx/model.onnx": b"decoy",
    "original/model.safetensors": b"decoy in a subfolder",
    "README.md": b"# tiny\n",
    ".gitattributes": b"*.safetensors filter=lfs\n",
}


# ---- the stand-in Hub -------------------------------------------------------------------------------------------
def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    revisions: dict[str, dict[str, bytes]]  # branch or tag -> {path: bytes}; each its own commit
    gated: bool = False  # files need `Authorization: Bearer TOKEN`

    def commit(self, revision: str) -> str | None:
        """The commit sha a branch, tag or sha names; None when the repo has no such revision."""
        shas = {hashlib.sha1(f"{name}:{sorted(files)}".encode()).hexdigest(): name
                for name, files in self.revisions.items()}
        if revision in shas:
            return revision
        if revision in self.revisions:
            return next(sha for sha, name in shas.items() if name == revision)
        return None

    def files(self, revision: str) -> dict[str, bytes]:
        return next(files for name, files in self.revisions.items() if self.commit(name) == self.commit(revision))


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo]
    url: str = ""
    requests: list[str] = field(default_factory=list)  # "METHOD /path?query"
    blobs: dict[str, bytes] = field(default_factory=dict)  # sha256 -> bytes, what the CDN serves


class _HubHandler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer  # with a .hub

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        hub: FakeHub = self.server.hub
        hub.requests.append(f"{self.command} {self.path}")
        # Split before unquoting: a revision is quoted whole (refs%2Fpr%2F1), a file path keeps its slashes.
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/")[1:]]
        if parts[:1] == ["cdn"]:
            data = hub.blobs[parts[1]]
            return self._send(200, data if body else b"", length=len(data))
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo_id, kind, revision = "/".join(parts[2:4]), parts[4], parts[5]
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, kind, revision = "/".join(parts[:2]), "resolve", parts[3]
        else:
            return self._error(404, "EntryNotFound", f"no route {self.path}", body)
        repo = hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found", body)
        sha = repo.commit(revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
        files = repo.files(sha)
        if kind == "revision":
            info = {"id": repo_id, "sha": sha, "private": False, "gated": "manual" if repo.gated else False,
                    "siblings": [{"rfilename": f} for f in sorted(files)]}
            return self._send(200, json.dumps(info).encode(), content_type="application/json")
        if kind == "tree":
            tree = [{"type": "file", "path": f, "size": len(d), "oid": git_blob_id(d),
                     **({"lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 134}}
                        if f.endswith(LFS_SUFFIXES) else {})} for f, d in sorted(files.items())]
            return self._send(200, json.dumps(tree).encode(), content_type="application/json")
        return self._resolve(hub, repo, sha, files, "/".join(parts[4:]), body)

    def _resolve(self, hub: FakeHub, repo: FakeRepo, sha: str, files: dict[str, bytes], name: str,
                 body: bool) -> None:
        auth = self.headers.get("Authorization")
        if repo.gated and auth != f"Bearer {TOKEN}":
            return self._error(401 if auth is None else 403, "GatedRepo",
                               "Access to this model is restricted: you must be authenticated and granted access",
                               body, commit=sha)
        if name not in files:
            return self._error(404, "EntryNotFound", f"{name} does not exist", body, commit=sha)
        data = files[name]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_id(data)}"'}
        if name.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            hub.blobs[sha256] = data
            port = self.server.server_address[1]
            headers |= {"X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(data)),
                        "Location": f"http://localhost:{port}/cdn/{sha256}"}
            return self._send(302, b"", headers=headers)
        return self._send(200, data if body else b"", headers=headers, length=len(data))

    def _error(self, status: int, code: str, message: str, body: bool, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message} | ({"X-Repo-Commit": commit} if commit else {})
        data = json.dumps({"error": message}).encode()
        self._send(status, data if body else b"", headers=headers, length=len(data), content_type="application/json")

    def _send(self, status: int, data: bytes, *, headers: dict[str, str] | None = None, length: int | None = None,
              content_type: str = "application/octet-stream") -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        self.wfile.write(data)


# ---- fixtures ---------------------------------------------------------------------------------------------------
def _folder_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """Two tiny random Llamas (with tokenizer) as HF folders' files: "main" and "v1" (another seed)."""
    root = tmp_path_factory.mktemp("models")
    return {rev: _folder_files(save_tiny_model(root / rev, seed=seed)) for rev, seed in (("main", 0), ("v1", 1))}


@pytest.fixture
def hub(model_files) -> FakeHub:
    """The stand-in Hub, serving on a random port of 127.0.0.1 for one test."""
    fake = FakeHub({
        "acme/tiny": FakeRepo({rev: files | DECOYS for rev, files in model_files.items()}),
        "acme/bin-only": FakeRepo({"main": {"config.json": model_files["main"]["config.json"],
                                            "pytorch_model.bin": b"pickled", "README.md": b"# bin\n"}}),
        "acme/gated": FakeRepo({"main": model_files["main"]}, gated=True),
    })
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HubHandler)
    server.daemon_threads = True
    server.hub = fake
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


@pytest.fixture
def hf_env(tmp_path, hub) -> dict[str, str]:
    """The environment of a download: the stand-in Hub, a cache in tmp_path, no token, no proxy."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING")) and k != "TRANSFORMERS_OFFLINE" and "proxy" not in k.lower()}
    return env | {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hub"),
                  "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1,localhost"}


RUNNER = """
import json, sys
from accel.hub.hf_hub import HubModelError, download
try:
    print(json.dumps({"path": str(download(sys.argv[1], known=json.loads(sys.argv[2])))}))
except HubModelError as e:
    print(json.dumps({"error": str(e)}))
"""


def fetch(spec: str, env: dict[str, str], **overrides: str) -> dict:
    """`download(spec)` in a fresh interpreter with `env | overrides`: {"path": ...} or {"error": message}."""
    proc = subprocess.run([sys.executable, "-c", RUNNER, spec, json.dumps(KNOWN)], env=env | overrides, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fetch_path(spec: str, env: dict[str, str], **overrides: str) -> Path:
    result = fetch(spec, env, **overrides)
    assert "path" in result, result
    return Path(result["path"])


def fetch_error(spec: str, env: dict[str, str], **overrides: str) -> str:
    result = fetch(spec, env, **overrides)
    assert "error" in result, result
    message = result["error"]
    assert "\n" not in message and repr(spec) in message
    assert all(name in message for name in KNOWN) and "local Hugging Face folder" in message and ".gguf" in message
    return message


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def downloads(hub: FakeHub) -> set[str]:
    """The files the client fetched (GET on resolve) from the stand-in."""
    resolved = [r.split("/resolve/", 1)[1] for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    return {r.split("/", 1)[1] for r in resolved}  # REV/FILE -> FILE


# ---- tests ------------------------------------------------------------------------------------------------------
def test_download_fetches_only_what_a_causal_lm_needs_into_the_hub_cache(hub, hf_env, tmp_path, model_files):
    folder = fetch_path("acme/tiny", hf_env)
    sha = hub.repos["acme/tiny"].commit("main")
    assert folder == tmp_path / "hub" / "models--acme--tiny" / "snapshots" / sha
    assert (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").read_text() == sha
    wanted = set(model_files["main"])  # config, generation config, safetensors, tokenizer files
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= wanted
    assert {p.name for p in folder.iterdir()} == wanted
    assert all((folder / f).read_bytes() == d for f, d in model_files["main"].items())
    assert (folder / "model.safetensors").resolve().parent.name == "blobs"  # the Hub cache's symlinks to blobs
    assert downloads(hub) == wanted - {"model.safetensors"}  # the weights came from the CDN Location
    assert any(r.startswith("GET /cdn/") for r in hub.requests)
    assert not any(d in r for r in hub.requests for d in DECOYS)  # not even a HEAD


@pytest.mark.parametrize("how", ["offline", "unreachable"])
def test_a_cached_model_needs_no_hub(hub, hf_env, how):
    first = fetch_path("acme/tiny", hf_env)
    seen = len(hub.requests)
    env = {"HF_HUB_OFFLINE": "1"} if how == "offline" else {"HF_ENDPOINT": closed_port_url()}
    assert fetch_path("acme/tiny", hf_env, **env) == first
    assert len(hub.requests) == seen


def test_offline_and_not_cached_says_so(hub, hf_env, tmp_path):
    message = fetch_error("acme/tiny", hf_env, HF_HUB_OFFLINE="1")
    assert "offline" in message and "HF_HUB_OFFLINE" in message and str(tmp_path / "hub") in message
    assert hub.requests == []


def test_unreachable_endpoint_is_named(hf_env):
    url = closed_port_url()
    message = fetch_error("acme/tiny", hf_env, HF_ENDPOINT=url)
    assert f"Hub endpoint {url} (HF_ENDPOINT) is unreachable" in message


def test_unknown_repo_is_not_found(hub, hf_env):
    message = fetch_error("acme/nope", hf_env)
    assert message.startswith("Hub model 'acme/nope' not found at " + hub.url)


def test_unknown_revision_is_not_found(hf_env):
    assert "has no revision 'v9'" in fetch_error("acme/tiny@v9", hf_env)


def test_a_repo_without_safetensors_is_refused_naming_what_it_has(hf_env):
    message = fetch_error("acme/bin-only", hf_env)
    assert "has no *.safetensors weights (it has pytorch_model.bin)" in message


def test_revision_is_passed_to_the_hub(hub, hf_env, tmp_path, model_files):
    folder = fetch_path("acme/tiny@v1", hf_env)
    sha = hub.repos["acme/tiny"].commit("v1")
    assert sha != hub.repos["acme/tiny"].commit("main")
    assert "GET /api/models/acme/tiny/revision/v1" in hub.requests
    assert folder.name == sha and (tmp_path / "hub" / "models--acme--tiny" / "refs" / "v1").read_text() == sha
    assert (folder / "model.safetensors").read_bytes() == model_files["v1"]["model.safetensors"]
    # A commit sha is a revision too: the client skips repo info and asks for that commit's files.
    assert fetch_path(f"acme/tiny@{sha}", hf_env) == folder


def test_gated_repo_needs_hf_token(hf_env, hub):
    message = fetch_error("acme/gated", hf_env)
    assert "is gated" in message and "HF_TOKEN" in message and f"{hub.url}/acme/gated" in message
    assert (fetch_path("acme/gated", hf_env, HF_TOKEN=TOKEN) / "model.safetensors").is_file()


def test_malformed_id_is_refused(hf_env):
    assert "is not a Hugging Face Hub model id" in fetch_error("a/b/c", hf_env)


@pytest.mark.parametrize("spec, ok", [
    ("Qwen/Qwen2.5-Coder-1.5B-Instruct", True),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", True),
    ("a/b", True),
    ("org_1/name.v2", True),
    ("Qwen/Qwen2.5-Coder-1.5B-Instruct@main", True),
    ("acme/tiny@v1.0", True),
    ("acme/tiny@0123456789abcdef0123456789abcdef01234567", True),
    ("acme/tiny@refs/pr/1", True),  # a revision may hold slashes; the repo id never more than one
    ("smollm2-135m", False),  # a registry name
    ("", False),
    ("a/b/c", False),
    ("./a/b", False),
    ("./a", False),
    ("../a", False),
    ("/abs/path", False),
    ("~/models", False),
    ("a/", False),
    ("/a", False),
    ("a//b", False),
    ("-a/b", False),
    ("a/b-", False),
    ("a.", False),
    ("a--b/c", False),
    ("a/b..c", False),
    ("a b/c", False),
    ("a/b@", False),
    ("@a/b", False),
    ("a/b@x y", False),
    ("a/b@/x", False),
    ("a/b@c@d", False),
    ("C:\\models\\x", False),
    ("o/" + "n" * 95, False),  # past 96 characters
    ("models/tiny.gguf", False),  # a local file that is not there, not a repo
])
def test_is_hub_id(spec, ok):
    assert is_hub_id(spec) is ok


def test_an_existing_local_path_is_no_hub_id(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_id("org/name")
    assert is_hub_id("org/other")


def test_the_engine_generates_from_a_downloaded_folder(hf_env):
    import torch
    from transformers import AutoModelForCausalLM

    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import SamplingParams

    folder = fetch_path("acme/tiny", hf_env)
    engine = Engine.from_pretrained(folder, num_kv_blocks=64, block_size=16, max_model_len=256)
    assert engine.tokenizer is not None  # the tokenizer files came along
    prompt = [5, 17, 42]
    rid = engine.add_request(prompt, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    outputs = []
    while engine.has_unfinished():
        outputs += [o for o in engine.step() if o.request_id == rid]
    got = outputs[-1].token_ids

    # The oracle: transformers' argmax, token by token, on the same folder.
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(3):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert list(got) == ids[len(prompt):]
