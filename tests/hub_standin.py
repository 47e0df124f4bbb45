"""A local stand-in of the Hugging Face Hub HTTP API, for `eyas publish` tests.

    with hub_standin() as hub:                     # 127.0.0.1, a free port, a background thread
        env["HF_ENDPOINT"] = hub.url
        ...                                          # HfApi(endpoint=hub.url).create_repo / upload_folder
        hub.requests                                 # every request: method, path, headers, body
        hub.files("acme/tiny-eagle3", "main")        # what the commits left on a branch: path -> bytes

It answers exactly what huggingface_hub 2.4.0 asks for in `HfApi.create_repo`, `HfApi.create_branch`
and `HfApi.upload_folder` (read from its hf_api.py, _commit_api.py, _upload_pipeline.py and lfs.py):

    POST /api/repos/create                               create_repo (409 with the url if it exists)
    GET  /api/models/ORG/NAME[/revision/REV]             repo_info: create_repo's fallback after a 401/403
    GET  /api/models/ORG/NAME/refs                       list_repo_refs: create_branch's fallback after a 403
    POST /api/models/ORG/NAME/branch/BRANCH              create_branch (409 if it exists)
    POST /api/validate-yaml                              upload_folder checks README.md's front matter first
    POST /api/models/ORG/NAME/preupload/REV              upload mode of each file: "regular" or "lfs"
    POST /ORG/NAME.git/info/lfs/objects/batch            LFS batch: the "basic" transfer (one PUT per object)
    PUT  /lfs-storage/OID                                the basic transfer's upload URL (no hub token wanted)
    POST /lfs-verify/OID                                 the LFS verify action
    POST /api/models/ORG/NAME/commit/REV                 the commit, ndjson: header, file (base64), lfsFile

Anything else (the xet token endpoints among them) is recorded as "unhandled" and answered 404.

Not xet. With hf_xet installed, `upload_folder` runs huggingface_hub's pipelined upload, which sends
every file the preupload call marks "lfs" through xet, and inlines (base64, in the commit) every file
marked "regular". So by default this stand-in marks every file "regular": no xet, no LFS. With
`lfs=True` it marks *.safetensors (and anything over 5 MB) "lfs" -- use that only with
HF_HUB_DISABLE_XET=1 in the client's environment, where huggingface_hub's legacy path asks the LFS
batch endpoint for ["basic", "multipart"] and this stand-in answers "basic" with its own upload and
verify URLs (no multipart `chunk_size`, so the client does one plain PUT).

`hub.fail("commit", 403)` makes that endpoint answer an HTTP error with a JSON body {"error": ...}
(and the X-Error-Message header the Hub sets); the endpoint names are those in ENDPOINTS.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

ENDPOINTS = (
    "create_repo",
    "repo_info",
    "list_refs",
    "create_branch",
    "validate_yaml",
    "preupload",
    "lfs_batch",
    "lfs_upload",
    "lfs_verify",
    "commit",
    "unhandled",
)
KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}
REGULAR_MAX = 5 * 1024 * 1024  # the Hub's limit on a file sent inline in a commit


@dataclass
class Recorded:
    """One request as the stand-in received it."""

    endpoint: str  # one of ENDPOINTS
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]  # as received, names lower-cased
    body: bytes
    status: int = 0  # what the stand-in answered

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


@dataclass
class Commit:
    repo_id: str
    revision: str
    summary: str
    oid: str
    files: dict[str, bytes]  # added or replaced in this commit
    deleted: list[str] = field(default_factory=list)


@dataclass
class _Repo:
    repo_type: str
    private: bool
    branches: dict[str, dict[str, bytes]]  # branch -> path -> bytes
    heads: dict[str, str]  # branch -> commit oid


def _oid(*parts: bytes) -> str:
    return hashlib.sha1(b"\0".join(parts) + str(time.time_ns()).encode()).hexdigest()


def _git_hash(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandIn:
    """The app and its records; `hub_standin()` serves it. Safe to read once the client is done."""

    def __init__(self, lfs: bool = False, user: str = "acme"):
        self.lfs = lfs
        self.user = user
        self.url = ""  # set when served
        self.requests: list[Recorded] = []
        self.commits: list[Commit] = []
        self.lfs_objects: dict[str, bytes] = {}  # sha256 hex -> bytes uploaded through the basic transfer
        self._repos: dict[str, _Repo] = {}
        self._failures: dict[str, tuple[int, str, int | None]] = {}
        self._lock = threading.Lock()
        self.app = self._build_app()

    # ------------------------------------------------------------------ control and records

    def fail(self, endpoint: str, status: int, message: str | None = None, times: int | None = None) -> None:
        """Answer `endpoint` with HTTP `status` and {"error": message} (`times` calls, default always)."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; one of {ENDPOINTS}")
        self._failures[endpoint] = (
            status,
            message or f"stand-in: {endpoint} refused with HTTP {status}",
            times,
        )

    def calls(self, endpoint: str) -> list[Recorded]:
        return [r for r in self.requests if r.endpoint == endpoint]

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The files on `revision` after every commit so far: path -> bytes."""
        return dict(self._repos[repo_id].branches[revision])

    def has_repo(self, repo_id: str) -> bool:
        return repo_id in self._repos

    # ------------------------------------------------------------------ plumbing

    async def _receive(self, request: Request, endpoint: str) -> tuple[Recorded, Response | None]:
        body = await request.body()
        rec = Recorded(
            endpoint=endpoint,
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            headers=[(k.lower(), v) for k, v in request.headers.items()],
            body=body,
        )
        with self._lock:
            self.requests.append(rec)
            failure = self._failures.get(endpoint)
            if failure is not None:
                status, message, times = failure
                if times is not None:
                    if times <= 1:
                        del self._failures[endpoint]
                    else:
                        self._failures[endpoint] = (status, message, times - 1)
                return rec, self._answer(rec, {"error": message}, status, {"X-Error-Message": message})
        return rec, None

    @staticmethod
    def _answer(rec: Recorded, content, status: int = 200, headers: dict | None = None) -> Response:
        rec.status = status
        return JSONResponse(content, status_code=status, headers=headers)

    def _not_found(self, rec: Recorded, repo_id: str) -> Response:
        return self._answer(
            rec,
            {"error": "Repository not found"},
            404,
            {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
        )

    def _repo(self, kind: str, namespace: str, name: str) -> tuple[str, _Repo | None]:
        repo_id = f"{namespace}/{name}"
        repo = self._repos.get(repo_id)
        return repo_id, (repo if repo is not None and repo.repo_type == KINDS.get(kind) else None)

    def _repo_url(self, repo_id: str, repo_type: str) -> str:
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        return f"{self.url}/{prefix}{repo_id}"

    def _upload_mode(self, path: str, size: int) -> str:
        if self.lfs and (path.endswith(".safetensors") or size > REGULAR_MAX):
            return "lfs"
        return "regular"

    # ------------------------------------------------------------------ the API

    def _build_app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.post("/api/repos/create")
        async def create_repo(request: Request):
            rec, failed = await self._receive(request, "create_repo")
            if failed:
                return failed
            payload = json.loads(rec.body)
            namespace = payload.get("organization") or self.user
            repo_id = f"{namespace}/{payload['name']}"
            repo_type = payload.get("type") or "model"
            url = self._repo_url(repo_id, repo_type)
            with self._lock:
                if repo_id in self._repos:
                    return self._answer(
                        rec, {"error": "You already created this model repo", "url": url}, 409
                    )
                self._repos[repo_id] = _Repo(
                    repo_type=repo_type,
                    private=payload.get("visibility") == "private",
                    branches={"main": {}},
                    heads={"main": _oid(repo_id.encode())},
                )
            return self._answer(rec, {"url": url, "name": repo_id, "id": repo_id})

        @app.post("/api/validate-yaml")
        async def validate_yaml(request: Request):
            rec, failed = await self._receive(request, "validate_yaml")
            return failed or self._answer(rec, {"errors": [], "warnings": []})

        @app.get("/api/{kind}/{namespace}/{name}/refs")
        async def list_refs(kind: str, namespace: str, name: str, request: Request):
            rec, failed = await self._receive(request, "list_refs")
            if failed:
                return failed
            repo_id, repo = self._repo(kind, namespace, name)
            if repo is None:
                return self._not_found(rec, repo_id)
            branches = [
                {"name": b, "ref": f"refs/heads/{b}", "targetCommit": oid} for b, oid in repo.heads.items()
            ]
            return self._answer(rec, {"branches": branches, "converts": [], "tags": [], "pullRequests": []})

        @app.get("/api/{kind}/{namespace}/{name}")
        async def repo_info_main(kind: str, namespace: str, name: str, request: Request):
            return await repo_info(kind, namespace, name, "main", request)

        @app.get("/api/{kind}/{namespace}/{name}/revision/{revision:path}")
        async def repo_info(kind: str, namespace: str, name: str, revision: str, request: Request):
            rec, failed = await self._receive(request, "repo_info")
            if failed:
                return failed
            repo_id, repo = self._repo(kind, namespace, name)
            if repo is None:
                return self._not_found(rec, repo_id)
            if revision not in repo.heads:
                return self._answer(
                    rec, {"error": f"Invalid rev id: {revision}"}, 404, {"X-Error-Code": "RevisionNotFound"}
                )
            return self._answer(
                rec,
                {
                    "id": repo_id,
                    "sha": repo.heads[revision],
                    "private": repo.private,
                    "siblings": [{"rfilename": p} for p in sorted(repo.branches[revision])],
                },
            )

        @app.post("/api/{kind}/{namespace}/{name}/branch/{branch:path}")
        async def create_branch(kind: str, namespace: str, name: str, branch: str, request: Request):
            rec, failed = await self._receive(request, "create_branch")
            if failed:
                return failed
            repo_id, repo = self._repo(kind, namespace, name)
            if repo is None:
                return self._not_found(rec, repo_id)
            start = (json.loads(rec.body) if rec.body else {}).get("startingPoint") or "main"
            with self._lock:
                if branch in repo.branches:
                    return self._answer(rec, {"error": "Reference already exists"}, 409)
                if start not in repo.branches:
                    return self._answer(
                        rec, {"error": f"Invalid rev id: {start}"}, 404, {"X-Error-Code": "RevisionNotFound"}
                    )
                repo.branches[branch] = dict(repo.branches[start])
                repo.heads[branch] = repo.heads[start]
            return self._answer(rec, {})

        @app.post("/api/{kind}/{namespace}/{name}/preupload/{revision:path}")
        async def preupload(kind: str, namespace: str, name: str, revision: str, request: Request):
            rec, failed = await self._receive(request, "preupload")
            if failed:
                return failed
            repo_id, repo = self._repo(kind, namespace, name)
            if repo is None:
                return self._not_found(rec, repo_id)
            present = repo.branches.get(revision, {})
            out = []
            for f in json.loads(rec.body)["files"]:
                mode = self._upload_mode(f["path"], f["size"])
                old = present.get(f["path"])
                # the remote oid lets the client skip unchanged files: git sha1, or sha256 for LFS
                oid = (
                    None
                    if old is None
                    else (hashlib.sha256(old).hexdigest() if mode == "lfs" else _git_hash(old))
                )
                out.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
            return self._answer(rec, {"files": out, "commitOid": repo.heads.get(revision)})

        @app.post("/{repo_path:path}.git/info/lfs/objects/batch")
        async def lfs_batch(repo_path: str, request: Request):
            rec, failed = await self._receive(request, "lfs_batch")
            if failed:
                return failed
            parts = repo_path.split("/")
            kind = parts.pop(0) if len(parts) == 3 else "models"
            repo_id, repo = self._repo(kind, *parts) if len(parts) == 2 else (repo_path, None)
            if repo is None:
                return self._not_found(rec, repo_id)
            payload = json.loads(rec.body)
            if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
                return self._answer(rec, {"message": "stand-in: only basic uploads"}, 422)
            objects = []
            for o in payload["objects"]:
                obj = {"oid": o["oid"], "size": o["size"]}
                if o["oid"] not in self.lfs_objects:  # no "actions": already stored, nothing to upload
                    obj["actions"] = {
                        "upload": {"href": f"{self.url}/lfs-storage/{o['oid']}"},
                        "verify": {"href": f"{self.url}/lfs-verify/{o['oid']}"},
                    }
                objects.append(obj)
            rec.status = 200
            return Response(
                json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"}),
                media_type="application/vnd.git-lfs+json",
            )

        @app.put("/lfs-storage/{oid}")
        async def lfs_upload(oid: str, request: Request):
            rec, failed = await self._receive(request, "lfs_upload")
            if failed:
                return failed
            if hashlib.sha256(rec.body).hexdigest() != oid:
                return self._answer(rec, {"error": "sha256 mismatch"}, 400)
            with self._lock:
                self.lfs_objects[oid] = rec.body
            rec.status = 200
            return Response(status_code=200, headers={"ETag": f'"{oid[:32]}"'})

        @app.post("/lfs-verify/{oid}")
        async def lfs_verify(oid: str, request: Request):
            rec, failed = await self._receive(request, "lfs_verify")
            if failed:
                return failed
            payload = json.loads(rec.body)
            stored = self.lfs_objects.get(oid)
            if stored is None or payload.get("oid") != oid or payload.get("size") != len(stored):
                return self._answer(rec, {"error": "object not stored"}, 404)
            return self._answer(rec, {"success": True})

        @app.post("/api/{kind}/{namespace}/{name}/commit/{revision:path}")
        async def commit(kind: str, namespace: str, name: str, revision: str, request: Request):
            rec, failed = await self._receive(request, "commit")
            if failed:
                return failed
            repo_id, repo = self._repo(kind, namespace, name)
            if repo is None:
                return self._not_found(rec, repo_id)
            if revision not in repo.branches:
                return self._answer(
                    rec, {"error": f"Invalid rev id: {revision}"}, 404, {"X-Error-Code": "RevisionNotFound"}
                )
            summary, added, deleted = "", {}, []
            for line in rec.body.splitlines():
                if not line.strip():
                    continue
                item = json.loads(line)
                key, value = item["key"], item["value"]
                if key == "header":
                    summary = value["summary"]
                elif key == "file":
                    if value.get("encoding") != "base64":
                        return self._answer(
                            rec, {"error": f"unknown encoding {value.get('encoding')!r}"}, 400
                        )
                    added[value["path"]] = base64.b64decode(value["content"])
                elif key == "lfsFile":
                    blob = self.lfs_objects.get(value["oid"])
                    if blob is None:
                        return self._answer(
                            rec, {"error": f"LFS object {value['oid']} was never uploaded"}, 400
                        )
                    added[value["path"]] = blob
                elif key in ("deletedFile", "deletedFolder"):
                    deleted.append(value["path"])
                else:
                    return self._answer(
                        rec, {"error": f"stand-in: unsupported commit operation {key!r}"}, 400
                    )
            oid = _oid(repo_id.encode(), revision.encode(), rec.body)
            with self._lock:
                tree = repo.branches[revision]
                for path in deleted:
                    for p in [p for p in tree if p == path or p.startswith(path.rstrip("/") + "/")]:
                        del tree[p]
                tree.update(added)
                repo.heads[revision] = oid
                self.commits.append(Commit(repo_id, revision, summary, oid, added, deleted))
            return self._answer(
                rec,
                {
                    "commitUrl": f"{self._repo_url(repo_id, repo.repo_type)}/commit/{oid}",
                    "commitOid": oid,
                    "pullRequestUrl": None,
                    "success": True,
                },
            )

        @app.api_route("/{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
        async def unhandled(rest: str, request: Request):
            rec, failed = await self._receive(request, "unhandled")
            return failed or self._answer(rec, {"error": f"stand-in: no {request.method} /{rest}"}, 404)

        return app


@contextlib.contextmanager
def hub_standin(lfs: bool = False, user: str = "acme", startup_timeout: float = 20.0) -> Iterator[HubStandIn]:
    """Serve a fresh `HubStandIn` on 127.0.0.1 (a free port) in a thread; always stopped on exit."""
    hub = HubStandIn(lfs=lfs, user=user)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    hub.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(
        hub.app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    errors: list[BaseException] = []

    def serve():
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # noqa: BLE001 -- reported to the caller below
            errors.append(e)

    thread = threading.Thread(target=serve, name="hub-standin", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout
        while not server.started:
            if errors or not thread.is_alive():
                raise RuntimeError(f"hub stand-in did not start: {errors[0] if errors else 'thread ended'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"hub stand-in did not start within {startup_timeout}s")
            time.sleep(0.02)
        yield hub
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("hub stand-in did not stop")
