"""Hugging Face Hub model ids (`ORG/NAME`, `ORG/NAME@REVISION`) downloaded into the Hub cache.

Everything goes through the real `huggingface_hub` client, as vLLM and llm-compressor do, so its environment
variables mean what they mean there: `HF_ENDPOINT` (the Hub or a mirror), `HF_TOKEN` (private and gated repos),
`HF_HUB_OFFLINE` (no network: the cache only), `HF_HOME` / `HF_HUB_CACHE` (where snapshots live:
`models--ORG--NAME/snapshots/<commit>/`). The client reads most of them once, when it is imported. A model already
in the cache is found there offline or when the Hub cannot be reached.

Only what a causal LM needs is downloaded: config, safetensors weights, tokenizer files and chat templates, from
the repo's top folder. Other weight formats (`.bin`, `.pt`, `.gguf`, ONNX) are never fetched; a repo that has no
safetensors weights is refused. Every failure is one `HubModelError` line: the id, why, and what works instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

# Files a transformers causal LM reads (config, weights, tokenizer, chat template); fnmatch patterns on repo paths.
ALLOW_PATTERNS = [
    "config.json", "generation_config.json",
    "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "*.jinja",
]
IGNORE_PATTERNS = [
    "*/*",  # subfolders (original/, onnx/, gguf/ ...): transformers loads a model from the repo's top folder
    "consolidated*.safetensors",  # Mistral's own format, next to the HF shards: the same weights a second time
]
# What to name when a repo is refused for having no safetensors weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".h5", ".msgpack", ".ckpt")

# Hub repo id rules (huggingface_hub's validate_repo_id): ORG and NAME of letters, digits, `_`, `-`, `.`, starting
# and ending with a letter, digit or `_`; no `--` or `..`; at most 96 characters in all. REVISION is a branch, tag or
# commit; a branch may hold slashes (`refs/pr/1`), the repo id never more than one.
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*))?")
_MAX_REPO_ID = 96


class HubModelError(FileNotFoundError):
    """A Hub model id that cannot be used; the message is one line: the id, why, and what works instead."""


def is_hub_id(spec: str) -> bool:
    """Whether `spec` has the shape of a Hub model id, `ORG/NAME` or `ORG/NAME@REVISION`, and is no local path."""
    m = _HUB_ID.fullmatch(spec)
    if m is None:
        return False
    repo = m["repo"]
    if len(repo) > _MAX_REPO_ID or "--" in repo or ".." in repo:
        return False
    if repo.endswith((".gguf", ".safetensors")):  # a local file that is not there: "not found on the Hub" misleads
        return False
    return not Path(spec).exists()


def split_hub_id(spec: str) -> tuple[str, str | None]:
    """`ORG/NAME@REV` -> (`ORG/NAME`, `REV`); no `@` -> (`ORG/NAME`, None): the repo's default branch."""
    repo, _, revision = spec.partition("@")
    return repo, revision or None


def download(spec: str, *, known: Sequence[str]) -> Path:
    """Download (or find in the Hub cache) what a causal LM needs of Hub model `spec`; returns the snapshot folder.

    `known` are the registry model names, named in every error as what works instead (with local paths).
    Raises `HubModelError` (one line) when the id is malformed, the model is not cached and the client is offline
    or the endpoint unreachable, the repo or revision does not exist, access is gated, or the repo has no
    config.json or no safetensors weights.
    """
    if not is_hub_id(spec):
        raise HubModelError(f"{spec!r} is not a Hugging Face Hub model id (ORG/NAME or ORG/NAME@REVISION); "
                            f"{_instead(known)}")
    import httpx
    from huggingface_hub import snapshot_download

    repo_id, revision = split_hub_id(spec)
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS,
                                        ignore_patterns=IGNORE_PATTERNS))
    except (OSError, ValueError, httpx.HTTPError) as e:  # the client's errors; HfHubHTTPError is an OSError
        # from None: the message already says why; the client's chain (httpx, retries) is pages of noise.
        raise HubModelError(f"Hub model {spec!r} {_why(e, repo_id, revision)}; {_instead(known)}") from None
    missing = [what for what, ok in (("config.json", (folder / "config.json").is_file()),
                                     ("*.safetensors weights", any(folder.glob("*.safetensors")))) if not ok]
    if missing:
        raise HubModelError(f"Hub model {spec!r} has no {' and no '.join(missing)} (it has "
                            f"{_describe(_repo_files(repo_id, folder))}); accel loads Hugging Face folders with "
                            f"safetensors weights; {_instead(known)}")
    return folder


def _why(err: BaseException, repo_id: str, revision: str | None) -> str:
    """Why the client failed, in words, from the error or the errors that caused it.

    snapshot_download reports "offline", "unreachable" and "Hub error" alike as LocalEntryNotFoundError ("not in
    the cache either"), with the real reason as its cause: the chain is read, not just the outer error.
    """
    import httpx
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, IncompleteSnapshotError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)

    endpoint, cache = constants.ENDPOINT, constants.HF_HUB_CACHE
    chain = _chain(err)
    not_cached = ("is only partly in the Hub cache" if any(isinstance(e, IncompleteSnapshotError) for e in chain)
                  else "is not in the Hub cache")
    if constants.HF_HUB_OFFLINE or any(isinstance(e, OfflineModeIsEnabled) for e in chain):
        return f"{not_cached} ({cache}) and HF_HUB_OFFLINE=1 forbids downloading it (offline)"
    for e in chain:
        if isinstance(e, (httpx.ConnectError, httpx.TimeoutException)):
            return (f"{not_cached} ({cache}) and the Hub endpoint {endpoint} (HF_ENDPOINT) is unreachable "
                    f"({_one_line(e)})")
        if isinstance(e, GatedRepoError):  # before RepositoryNotFoundError: it is one
            return (f"is gated at {endpoint}: accept its terms at {endpoint}/{repo_id} and set HF_TOKEN to a token "
                    f"of an account with access")
        if isinstance(e, RepositoryNotFoundError):
            return f"not found at {endpoint} (no such repo, or a private one HF_TOKEN does not grant access to)"
        if isinstance(e, RevisionNotFoundError):
            return f"not found at {endpoint}: the repo has no revision {revision!r}"
        if isinstance(e, HfHubHTTPError):
            return f"could not be downloaded from {endpoint} ({_one_line(e)})"
    return f"could not be downloaded from {endpoint} ({_one_line(err)})"


def _chain(err: BaseException) -> list[BaseException]:
    """`err` and the errors it was raised from (`raise ... from`, or raised while handling)."""
    out: list[BaseException] = []
    e: BaseException | None = err
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _one_line(err: BaseException) -> str:
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _repo_files(repo_id: str, folder: Path) -> list[str]:
    """Every file of the repo at the snapshot's commit, from the tree listing snapshot_download cached (no network);
    the files of the snapshot folder where that listing is not cached."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        return sorted(f.path for f in get_cached_repo_tree(repo_id, revision=folder.name))
    except CachedRepoTreeNotFoundError:
        return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _describe(files: list[str], limit: int = 8) -> str:
    """The weight files among `files` (all files if there are none), at most `limit` named."""
    shown = [f for f in files if f.endswith(WEIGHT_SUFFIXES)] or files
    if not shown:
        return "no files"
    more = f" and {len(shown) - limit} more" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more


def _instead(known: Sequence[str]) -> str:
    registry = f"a registry model ({', '.join(known)}), " if known else ""
    return f"use instead {registry}a local Hugging Face folder or a local .gguf file"
